"""Perception NNs in the loop: a torch NN wrapped as the callable the application protocol takes.

An example application's ``evaluate_perception`` (the protocol's
:data:`~qaopt.calibrate.protocols.Perception`) calls each NN with a float32 batch of
frames and wants a batch of estimates back; both shipped applications use this
wrapper. torch is imported on call, so that importing a package does not import it.
"""

from __future__ import annotations

from typing import Any


def torch_perception(model: Any, device: str = "cpu", batch_size: int = 64):
    """Wrap a torch NN as a perception callable: float32 ndarray (B,3,H,W) -> ndarray (B,)."""
    import numpy as np
    import torch

    model = model.eval().to(device)

    def perceive(images: np.ndarray) -> np.ndarray:
        out = []
        with torch.inference_mode():
            for i in range(0, len(images), batch_size):
                batch = torch.from_numpy(np.ascontiguousarray(images[i : i + batch_size])).to(device)
                out.append(model(batch).float().cpu().numpy().reshape(-1))
        return np.concatenate(out) if out else np.empty(0, dtype=np.float32)

    return perceive
