"""The ONNX toolchain approx is handed: its own module, so that both the pass registry and the int8 code can name it.

:class:`~qaopt.approx.passes.BuildContext` carries one and :func:`qaopt.approx.quantize.quantize_int8`
uses one; were it declared in either, the other would import it and, through the passes
package that registers the quantization pass, import itself in a circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence


class OnnxToolchain(Protocol):
    """Exports a torch module to ONNX and opens ONNX Runtime sessions (``qaopt.kernels.onnx`` is one).

    Graphs have one input named ``input`` and one output named ``output``, with a
    dynamic batch dimension. approx takes it by injection: it never imports kernels.
    """

    def export_onnx(self, module: Any, example_inputs: Sequence, path: str | Path) -> Path: ...

    def ort_session(self, path: str | Path, threads: int | None = None, device: str = "cpu") -> Any: ...
