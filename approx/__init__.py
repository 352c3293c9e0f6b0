"""Approximation passes: build candidate NNs (pruned, factorized, fine-tuned, quantized) and measure them.

The whole API::

    nn = TargetNN.from_spec("heading", spec.nns["heading"])   # or TargetNN(name, model, data, input_shape, metric)
    cand = build(nn, Knobs(prune_ratio=0.5, prune_steps=4, finetune_steps=400, dtype="int8"),
                 cache_dir=..., onnx=qaopt.kernels.onnx)
    cand.error, cand.residuals, cand.macs, cand.params, cand.runnable_on, cand.module, cand.onnx_path

    space = KnobSpace.from_section(spec.knobs_for("heading"), SearchLimits(max_finetune_steps=160))
    knobs = space.sample(optuna_trial, "heading")                # one trial's knobs, pass by pass
    describe(knobs)                                              # {"prune ratio": "0.50", "dtype": "int8", ...}
    for cand in sweep(nn, space.base(), "prune_ratio", [0, 0.5, 0.9]): ...

Which knobs exist is declared by the registered passes (:mod:`qaopt.approx.passes`, whose
``passes()`` lists them; ``qaopt.approx.passes`` itself is that module).
Names are loaded on first use, so reading a spec's knob space never imports torch.
"""

from __future__ import annotations

from qaopt.app_spec.lazy import lazy_exports

_EXPORTS = {
    "ApproxError": ".errors",
    "EntryPointFailed": ".errors",
    "ApproximationPass": ".passes",
    "BuildContext": ".passes",
    "OnnxToolchain": ".toolchain",
    "PassConfig": ".passes",
    "PassKnobs": ".passes",
    "SearchLimits": ".passes",
    "get_pass": ".passes",
    "register_pass": ".passes",
    "unregister_pass": ".passes",
    "Dtype": ".passes.quantization",
    "DTYPES": ".passes.quantization",
    "RUNNABLE_ON": ".passes.quantization",
    "Knobs": ".knobs",
    "describe": ".knobs",
    "knob_names": ".knobs",
    "KnobSpace": ".space",
    "canonical_section": ".space",
    "section_fields": ".space",
    "validate_section": ".space",
    "build": ".builder",
    "ladder_of": ".ladder",
    "Ladder": ".ladder",
    "LadderRecipe": ".ladder",
    "Rung": ".ladder",
    "Candidate": ".candidate",
    "FinetuneRecipe": ".finetune",
    "native_bf16": ".finetune",
    "sweep": ".sweep",
    "ErrorMetric": ".target",
    "NNData": ".target",
    "TargetNN": ".target",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
