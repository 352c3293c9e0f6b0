"""One module per CLI command group; `qaopt.cli` registers them."""
