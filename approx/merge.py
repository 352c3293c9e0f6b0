"""NNs that read the same input, merged: one shared backbone with one output head per NN.

Two NNs that look at the same camera frame each pay for a whole backbone; most of
that work computes the same kind of features. A merged NN is the largest member's
model (by MACs) with its output layer widened to every member's outputs, distilled
from all the references at once on the lead's training frames. Every other knob
(pruning, resolution, dtype) then applies to the merged NN as to any NN, and a frame
runs it once for all its members.

Each member keeps its own error: the merged candidate is measured on each member's own
validation data, in that member's output columns, with that member's metric
(:func:`build_merged` returns one view of the candidate per member). Whether the
application tolerates what sharing costs each NN is for the region and the closed
loop to decide, as for every other knob.

Distilling end to end runs the whole merged NN forward and backward on every step: for CropFollow's 240x320
frames about 18 minutes on a 2-core CPU without bf16 instructions. A group that names ``freeze`` (a submodule of
the lead, its backbone) keeps that part as the lead trained it: its outputs on the training frames are computed
once, and each step trains only what reads them (the heads), 63 ms a step against 359 on that CPU. The lead's
features then serve every member, so this suits members whose outputs its features carry (CropFollow's heading
and distance both read the crop rows' geometry); whether they do is for the errors and the closed loop to say.

Layout under the approx store: ``merged/<key>/`` the distilled merged NN (before any
other knob), ``views/<candidate key>/`` each member's error and residuals on its data.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch_pruning as tp
from torch import nn

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.store import read_json, write_json

from .builder import build
from .cache import Store
from .candidate import Candidate
from .errors import ApproxError
from .finetune import Distiller, FinetuneRecipe, reproducible, teacher_outputs
from .knobs import Knobs
from .pruning import output_heads
from .quantize import CPU_BATCH, predict_torch
from .target import ErrorMetric, TargetNN, same_frames

FORMAT = 1
"""Bumped when what a stored merged NN or view means changes, so old entries are never misread."""
VIEW_KIND, VIEW_VERSION = "approx.merged.view", 1
MERGE_SEP = "+"
FEATURES_GPU_BATCH = 64
"""Frames per forward pass when a frozen part's outputs are computed on a GPU (on a CPU: ``CPU_BATCH``)."""

Progress = Callable[[str], None]


def merged_name(names: Sequence[str]) -> str:
    """The name of the merged NN of ``names``: ``heading+distance``."""
    return MERGE_SEP.join(names)


class OutputColumns(nn.Module):
    """One member's outputs of a merged NN: the columns ``columns`` of ``merged``'s output."""

    def __init__(self, merged: nn.Module, columns: Sequence[int]):
        super().__init__()
        self.merged = merged
        self.columns = list(columns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merged(x)[:, self.columns]


class MergedHeads(nn.Module):
    """The lead NN with its output layer widened to every member's outputs.

    Each column ``c`` of the widened model is mapped by ``scale[c] * y + shift[c]`` into its member's unit: the
    lead's own columns unchanged, every other column from the spread of the lead's outputs to the spread of its
    member's, so that the lead's layers keep working at the scale they were trained at.
    """

    def __init__(self, model: nn.Module, scale: torch.Tensor, shift: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("scale", scale.view(1, -1).float())
        self.register_buffer("shift", shift.view(1, -1).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) * self.scale + self.shift


@dataclass(frozen=True)
class MergedData:
    """The merged NN's data: the lead's frames, with every member's reference outputs as targets.

    Validation targets are the lead's labels in its columns and the other members' reference outputs
    in theirs; each member's own error is measured on its own validation data (:func:`build_merged`).
    """

    x_train: object
    y_train: np.ndarray
    x_val: object
    y_val: np.ndarray
    val_sequences: Sequence[np.ndarray]
    fingerprint: str


@dataclass(frozen=True)
class MergeGroup:
    """NNs that read the same input, and what merging them costs to train."""

    members: tuple[TargetNN, ...]
    finetune_steps: int
    """Distillation steps of the merged NN from the references, before any other knob."""
    freeze: str | None = None
    """The lead's submodule (its attribute path, ``backbone``) kept as the lead trained it while the rest distils;
    ``None``: the whole merged NN distils end to end."""
    end_to_end_steps: int = 0
    """With ``freeze``: distillation steps of the whole merged NN after the frozen ones, so that the backbone adapts
    to every head (CropFollow's merged int8 NN failed 1 of 56 unseen closed-loop runs as frozen-distilled, 0 of 56
    after 1000 more steps end to end: docs/benchmarks/merge_adapt_fresh.json and merge_adapt_e2e.json)."""

    def __post_init__(self) -> None:
        names = [m.name for m in self.members]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"a merge group needs two or more distinct NNs, got {names}")
        shapes = {tuple(m.input_shape) for m in self.members}
        if len(shapes) != 1:
            raise ApproxError(merged_name(names), "merge", f"the NNs take inputs of different shapes {sorted(shapes)}; "
                                                           "only NNs that read the same input can share a backbone")
        if self.end_to_end_steps and self.freeze is None:
            raise ApproxError(merged_name(names), "end_to_end_steps", "end-to-end steps follow a frozen distillation; "
                                                                     "without freeze every step is end to end")

    @classmethod
    def from_section(cls, section, nns: Mapping[str, TargetNN]) -> MergeGroup:
        """The group a spec's ``search.merge`` entry (or a run's plan of it: anything with ``nns``,
        ``finetune_steps``, ``freeze`` and ``end_to_end_steps``) names, over the loaded ``nns``."""
        return cls(tuple(nns[n] for n in section.nns), section.finetune_steps, section.freeze, section.end_to_end_steps)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    @property
    def name(self) -> str:
        return merged_name(self.names)

    def lead(self) -> TargetNN:
        """The member whose backbone the merged NN keeps: the one with the most MACs (the first listed on a tie)."""
        macs = [tp.utils.count_ops_and_params(m.model, m.example_input)[0] for m in self.members]
        return self.members[int(np.argmax(macs))]

    def columns(self) -> dict[str, list[int]]:
        """Each member's output columns in the merged NN's output."""
        out, start = {}, 0
        for m in self.members:
            width = _outputs(m)
            out[m.name] = list(range(start, start + width))
            start += width
        return out


def _outputs(nn_: TargetNN) -> int:
    return int(np.asarray(nn_.data.y_val).shape[1])


def merged_target(group: MergeGroup, *, cache_dir: str | Path | None = None, recipe: FinetuneRecipe = FinetuneRecipe(),
                  device: str = "cpu", progress: Progress = lambda message: None) -> TargetNN:
    """The merged NN of ``group`` as a :class:`TargetNN` (distilled once, then cached): every knob builds on it."""
    store = Store(cache_dir)
    lead = group.lead()
    columns = group.columns()
    # NNs built without a frozen part, or without end-to-end steps after it, keep the keys they had
    phases = [{"freeze": group.freeze}] if group.freeze else []
    phases += [{"end_to_end_steps": group.end_to_end_steps}] if group.end_to_end_steps else []
    key = content_hash("approx.merged", FORMAT, [m.fingerprint for m in group.members], lead.name,
                       group.finetune_steps, recipe.as_dict(), *phases)
    d = lead.data
    y_train = np.concatenate([_reference_outputs(m, lead, "train", store, device) for m in group.members], axis=1)
    y_val = np.concatenate([np.asarray(d.y_val) if m is lead else _reference_outputs(m, lead, "val", store, device)
                            for m in group.members], axis=1)
    data = MergedData(d.x_train, y_train, d.x_val, y_val, d.val_sequences, fingerprint=key)
    metric = ErrorMetric(lead.metric.kind, columns[lead.name][lead.metric.column], lead.metric.threshold)
    outputs = None  # its outputs on its training frames, where distilling it computed them
    with store.lock(key):
        folder = store.entry("merged", key)
        if folder is not None:
            model = store.load_module(folder)
        else:
            # Seeded before the output layer is widened: its new rows are drawn from torch's generator, and drawn from
            # whatever state the process has left it in they would make each run's merged NN another one under one
            # key, with its own error.
            torch.manual_seed(int(key[:8], 16))
            model = _widened(group, lead, columns, y_train)
            merging = f"merging {', '.join(group.names)} into one backbone"
            how = f", {lead.name}'s {group.freeze} frozen" if group.freeze else ""
            progress(f"{merging}: distilling {group.finetune_steps} steps{how} (once per cache)")

            def report(done: int, steps: int, seconds: float) -> None:
                progress(f"{merging}: {done} of {steps} steps in {seconds / 60:.1f} min, "
                         f"about {seconds / done * (steps - done) / 60:.0f} min left")
            with _replayed(model, group, lead, d.x_train, device) as frames:
                Distiller(frames, y_train, lambda: y_train, recipe, int(key[:8], 16), device).run(
                    model, group.finetune_steps, report)
                if group.freeze and not group.end_to_end_steps:
                    # What distils from the merged NN (a scale's adaptation, a pruned candidate) learns its outputs
                    # on these frames; with the frozen part's outputs at hand only the rest runs: the same numbers
                    # as the whole NN's at the batch teacher_outputs takes, for a tenth of a minute's work.
                    with reproducible(torch.device(device)):
                        outputs = predict_torch(model, frames, device=device)
            if group.end_to_end_steps:
                progress(f"{merging}: distilling {group.end_to_end_steps} steps end to end (once per cache)")
                Distiller(d.x_train, y_train, lambda: y_train, recipe, int(key[8:16], 16), device).run(
                    model, group.end_to_end_steps, report)
            (store.root / "merged").mkdir(exist_ok=True)
            with store.writing("merged", key) as tmp:
                store.save_module(model, tmp)
    target = TargetNN(group.name, model, data, tuple(lead.input_shape), metric, architecture=key)
    if outputs is not None and store.teacher_outputs(target.fingerprint) is None:
        store.save_teacher_outputs(target.fingerprint, outputs)
    return target


class _Replay(nn.Module):
    """Stands in for a frozen submodule while the rest of the merged NN distils: its outputs on the frames of the
    current batch (``rows``), computed once. They are a plain attribute, not a buffer, so that moving the student
    to its device or memory layout does not copy every frame's features."""

    def __init__(self, outputs: torch.Tensor):
        super().__init__()
        self.outputs = outputs
        self.rows: np.ndarray | None = None

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.outputs[torch.from_numpy(self.rows)].to(x.device)


class _ReplayedFrames:
    """The training frames as the Distiller samples them, telling the replay which frames each batch holds.

    What the student computes from a batch's frames before the frozen part is thrown away (the replay stands in for
    the part's outputs, and nothing before it gets a gradient), so every batch of one size reads the same stand-in,
    made once: converting training frames took 25 CPU s of the README's quick run's agnostic search, most of them
    these batches' (docs/benchmarks/readme_runs/session37-profile/profile_stages.json, ``FrameArray.__getitem__``).
    Where nothing with state runs before the frozen part (CropFollow's NNs only normalise the frame), the stand-in
    is one value per channel (``shape``), not a frame: normalising and reordering a full-size batch on every step is
    work whose result the frozen part throws away. Neither changes a bit of the merged NN."""

    def __init__(self, frames, replay: _Replay, shape: tuple[int, ...] | None = None):
        self.frames, self.replay, self.shape = frames, replay, shape
        self._stand_in: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, rows: np.ndarray | slice):
        self.replay.rows = np.arange(len(self.frames))[rows]
        n = len(self.replay.rows)
        if n not in self._stand_in:
            self._stand_in[n] = (np.zeros((n, *self.shape), dtype=np.float32) if self.shape is not None
                                 else np.asarray(self.frames[np.arange(n)], dtype=np.float32))
        return self._stand_in[n]


def _small_stand_in(model: nn.Module, replay: _Replay, frames) -> tuple[int, ...] | None:
    """The shape of one frame's small stand-in (its channels, every other side 1) when ``model``, its frozen part
    replayed, runs it to the same output shape and nothing that runs before the replay keeps state a training step
    would change (a BatchNorm's running statistics); else ``None``: the stand-in is a full-size frame."""
    full = np.asarray(frames[np.arange(1)], dtype=np.float32)
    shape = (full.shape[1], *(1,) * (full.ndim - 2)) if full.ndim > 2 else None
    if shape is None:
        return None
    called: list[nn.Module] = []
    hooks = [m.register_forward_pre_hook(lambda module, args: called.append(module)) for m in model.modules()]
    replay.rows = np.arange(1)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model(torch.from_numpy(full)).shape
            called.clear()
            small = model(torch.zeros((1, *shape))).shape
    except Exception:  # noqa: BLE001 - a layer before the frozen part that needs the frame's size: use the frame
        return None
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    if small != expected or replay not in called:
        return None
    ancestors = {id(m) for m in model.modules() if any(c is replay for c in m.modules())}
    before = called[:called.index(replay)]
    if any(any(True for _ in m.buffers(recurse=False)) for m in before if id(m) not in ancestors):
        return None
    return shape


def frozen_part(group: MergeGroup, lead: TargetNN) -> nn.Module:
    """The submodule of the lead's model that ``group.freeze`` names, checked: it exists and does not hold the
    output layer (which the merged NN widens, so it must learn). ``qaopt validate`` calls it before any run."""
    path = group.freeze
    try:
        part = lead.model.get_submodule(path)
    except AttributeError:
        children = [name for name, _ in lead.model.named_children()]
        raise ApproxError(group.name, "freeze", f"NN {lead.name!r} (the group's lead) has no submodule {path!r}; "
                                                f"its top-level submodules are {children}: name the one that computes "
                                                "the features its output layer reads") from None
    inside = {id(p) for p in part.parameters()}
    if any(id(p) in inside for head in output_heads(lead.model, lead.example_input) for p in head.parameters()):
        raise ApproxError(group.name, "freeze", f"{path!r} holds NN {lead.name!r}'s output layer, which the merged "
                                                "NN widens to every member's outputs and must learn; name the part "
                                                "before the output layer (its backbone)")
    return part


@contextlib.contextmanager
def _replayed(model: MergedHeads, group: MergeGroup, lead: TargetNN, frames, device: str):
    """The training frames to distil ``model`` on: as they are, or, when the group freezes a part of the lead,
    with that part's outputs computed once and replayed while the rest trains (the part put back after)."""
    if group.freeze is None:
        yield frames
        return
    frozen_part(group, lead)
    path = group.freeze
    part = model.model.get_submodule(path)
    replay = _Replay(_outputs_of(model, part, path, group, frames, device))
    parent, _, name = path.rpartition(".")
    owner = model.model.get_submodule(parent)
    setattr(owner, name, replay)
    try:
        yield _ReplayedFrames(frames, replay, _small_stand_in(model, replay, frames))
    finally:
        setattr(owner, name, part)


def _outputs_of(model: nn.Module, part: nn.Module, path: str, group: MergeGroup, frames, device: str) -> torch.Tensor:
    """``part``'s outputs when ``model`` (in eval mode, as it runs) reads each of ``frames``, on the CPU.

    On a CPU the frames go through :data:`~.quantize.CPU_BATCH` at a time, as every prediction does: on CropFollow's
    compact backbone that batch is faster a frame than 64 at once, with the same features to the bit.
    """
    captured: list = []
    hook = part.register_forward_hook(lambda module, args, out: captured.append(out))
    there = torch.device(device)
    batch = CPU_BATCH if there.type == "cpu" else FEATURES_GPU_BATCH
    model.eval().to(there)
    outputs = []
    try:
        with torch.no_grad(), reproducible(there):
            for i in range(0, len(frames), batch):
                captured.clear()
                model(torch.from_numpy(np.asarray(frames[i:i + batch], dtype=np.float32)).to(there))
                if len(captured) != 1 or not isinstance(captured[0], torch.Tensor):
                    what = f"runs {len(captured)} times" if len(captured) != 1 else "returns no single tensor"
                    raise ApproxError(group.name, "freeze", f"{path!r} {what} in one forward pass; a frozen part "
                                      "must run once and return one tensor (the features the output layer reads)")
                outputs.append(captured[0].float().cpu())
    finally:
        hook.remove()
        model.to("cpu")
    return torch.cat(outputs)


def _reference_outputs(member: TargetNN, lead: TargetNN, split: str, store: Store, device: str) -> np.ndarray:
    """``member``'s reference outputs on the lead's ``split`` frames (its teacher outputs when they are its own
    frames: the lead's, or a member that reads the same ones, as CropFollow's heading and distance do)."""
    if split == "train" and (member is lead or same_frames(member.data.x_train, lead.data.x_train)):
        return teacher_outputs(member, store, device)
    key = content_hash("approx.merged.reference", member.fingerprint, lead.fingerprint, split)
    outputs = store.teacher_outputs(key)
    if outputs is None:
        with reproducible(torch.device(device)):  # as teacher_outputs: a GPU's choice of kernels must not move them
            outputs = predict_torch(copy.deepcopy(member.model).float().eval(), getattr(lead.data, f"x_{split}"),
                                    device=device)
        store.save_teacher_outputs(key, outputs)
    return outputs


def _widened(group: MergeGroup, lead: TargetNN, columns: dict[str, list[int]], y_train: np.ndarray) -> MergedHeads:
    """The lead's model with its one output layer widened to every member's columns (its own rows kept)."""
    model = copy.deepcopy(lead.model).float().eval()
    heads = output_heads(model, lead.example_input)
    if len(heads) != 1 or not isinstance(heads[0], nn.Linear | nn.Conv2d):
        raise ApproxError(group.name, "merge", f"NN {lead.name!r} has no single linear or conv output layer to widen "
                                               f"into one head per NN; merge needs one")
    old = heads[0]
    total = sum(len(c) for c in columns.values())
    if isinstance(old, nn.Linear):
        new = nn.Linear(old.in_features, total, bias=old.bias is not None)
    else:
        new = nn.Conv2d(old.in_channels, total, old.kernel_size, old.stride, old.padding, old.dilation, old.groups,
                        bias=old.bias is not None)
    own = columns[lead.name]
    with torch.no_grad():
        new.weight[own] = old.weight
        if old.bias is not None:
            new.bias[own] = old.bias
    path = next(name for name, m in model.named_modules() if m is old)
    parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    setattr(parent, path.rpartition(".")[2], new)
    # Every column leaves the lead's layers at the lead's output spread; map it to its member's.
    lead_y = y_train[:, own]
    mean, std = lead_y.mean(), max(float(lead_y.std()), 1e-6)
    scale, shift = np.ones(total, np.float32), np.zeros(total, np.float32)
    for name, cols in columns.items():
        if name != lead.name:
            s = y_train[:, cols].std(axis=0) / std
            scale[cols], shift[cols] = s, y_train[:, cols].mean(axis=0) - s * mean
    merged = MergedHeads(model, torch.from_numpy(scale), torch.from_numpy(shift)).eval()
    with torch.no_grad():
        out = merged(lead.example_input)
    if tuple(out.shape) != (lead.input_shape[0], total):
        raise ApproxError(group.name, "merge", f"widening {lead.name!r}'s output layer to {total} outputs gives an "
                                               f"output of shape {tuple(out.shape)}; merge needs an NN whose output "
                                               "layer's outputs are its outputs")
    return merged


def build_merged(group: MergeGroup, knobs: Knobs, *, cache_dir: str | Path | None = None,
                 recipe: FinetuneRecipe = FinetuneRecipe(), backend: str | None = None, onnx=None,
                 device: str = "cpu", progress: Progress = lambda message: None) -> dict[str, Candidate]:
    """The merged candidate ``knobs`` make of ``group``, as one view per member (name -> :class:`Candidate`).

    Every view is the same candidate (its key, module and graph: a frame runs it once); each carries its
    member's error and residuals, measured on that member's own validation data, and the member's output
    ``columns``. ``progress`` hears the merged NN's distillation (minutes, once per cache), not each candidate's
    build, which takes seconds and which a search's trial lines already say.
    """
    target = merged_target(group, cache_dir=cache_dir, recipe=recipe, device=device, progress=progress)
    merged = build(target, knobs, cache_dir=cache_dir, recipe=recipe, backend=backend, onnx=onnx, device=device)
    store = Store(cache_dir)
    (store.root / "views").mkdir(exist_ok=True)
    columns = group.columns()
    with store.lock(f"views-{merged.key}"):
        folder = store.root / "views" / merged.key
        meta = read_json(folder / "view.json", VIEW_KIND, VIEW_VERSION) if store.entry("views", merged.key) else None
        if meta is None:
            with store.writing("views", merged.key) as tmp:
                meta, ran = {}, []  # (frames, the merged NN's outputs on them): members reading one camera share a run
                for m in group.members:
                    d = m.data
                    whole = next((out for frames, out in ran if same_frames(frames, d.x_val)), None)
                    if whole is None:
                        whole = merged.predict(d.x_val)
                        ran.append((d.x_val, whole))
                    pred = whole[:, columns[m.name]]
                    meta[m.name] = {"metric": m.metric.kind, "error": m.metric(pred, np.asarray(d.y_val))}
                    np.savez(tmp / f"residuals-{m.name}.npz", *m.metric.residuals(pred, np.asarray(d.y_val),
                                                                                   d.val_sequences))
                write_json(tmp / "view.json", VIEW_KIND, VIEW_VERSION, meta)
    views = {}
    for m in group.members:
        with np.load(folder / f"residuals-{m.name}.npz") as npz:
            residuals = tuple(npz[f"arr_{i}"] for i in range(len(npz.files)))
        views[m.name] = dataclasses.replace(merged, nn=m.name, metric=meta[m.name]["metric"],
                                            error=meta[m.name]["error"], residuals=residuals, serves=group.names,
                                            columns=tuple(columns[m.name]))
    return views
