"""What an Nsight Systems name means in lmprof's table: NVTX ranges, runtime calls, copies.

Every rule that turns a name of an ``nsys export --type sqlite`` file into the name and category a
Kineto trace would give the same thing lives here, so the analyses (written for Kineto's names)
read an export unchanged:

* **PyTorch ``emit_nvtx`` ranges** end in ``, seq = N``, ``, op_id = N``, ``, sizes = [...]``,
  ``, input_op_ids = [...]`` (torch's NVTX string of a ``RecordFunction``). The suffix is cut off
  (``seq`` kept as the sequence number, Kineto's ``Sequence number``) and the range is an operator
  (``cpu_op``) unless its name reads like a ``record_function`` scope (:func:`is_scope_name`), which
  is an annotation (``user_annotation``) as Kineto records it.
* **Other NVTX ranges** (llm.c's ``Layer 3``, a user's ``nvtx.range``) are annotations.
* **Steps**: a range named ``ProfilerStep#N``, llm.c's ``Train step N``, ``step N`` or ``iteration N``
  is the step ``ProfilerStep#N`` (the name every step figure and the critical path look for).
* **Runtime calls**: the API version suffix nsys adds (``cudaLaunchKernel_v7000``) is cut off.
* **Copies and sets**: named as Kineto names them, ``Memcpy HtoD (Pinned -> Device)``,
  ``Memset (Device)``, from the export's copy kind and memory kinds.
"""
from __future__ import annotations

import re

ANNOTATION = "user_annotation"
OPERATOR = "cpu_op"
STEP_FORMAT = "ProfilerStep#{}"

# torch's emit_nvtx suffixes, in the order torch writes them; at least one must be there
_EMIT_SUFFIX = re.compile(
    r"(?:, seq = (?P<seq>\d{1,18}))?(?:, op_id = (?P<op>\d{1,18}))?(?:, sizes = \[.*?\])?"
    r"(?:, input_op_ids = \[.*?\])?\Z",
    re.DOTALL,
)
_MARKERS = (", seq = ", ", op_id = ", ", sizes = ", ", input_op_ids = ")
_STEP = re.compile(r"(?:ProfilerStep#|(?:train(?:ing)?[ _])?step[ _#]?|iteration[ _#]?)(\d{1,18})", re.IGNORECASE)
_API_VERSION = re.compile(r"_v\d+\Z")
_BACKWARD_NODE = "autograd::engine::evaluate_function: "

# CUPTI's copy kinds and memory kinds as Kineto's copy names spell them (ENUM_CUDA_MEMCPY_OPER and
# ENUM_CUDA_MEM_KIND of the export hold the same numbering)
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
                6: "Managed Static", 7: "Unknown"}


def split_emit_nvtx(name: str) -> tuple[str, int, bool]:
    """(name without torch's emit_nvtx suffix, its ``seq`` or -1, whether it had the suffix).

    The suffix starts at the first of its markers (found by ``str.find``: linear in the name, so a
    hostile name of a million commas costs one pass) and must run to the end of the name."""
    found = [i for i in (name.find(m) for m in _MARKERS) if i > 0]
    if not found:
        return name, -1, False
    cut = min(found)
    m = _EMIT_SUFFIX.match(name, cut)
    if m is None or m.end() == cut:
        return name, -1, False
    seq = m.group("seq")
    return name[:cut], int(seq) if seq is not None else -1, True


def is_scope_name(name: str) -> bool:
    """A ``record_function`` scope rather than an operator: its name has a space, a ``#``
    (``ProfilerStep#3``, ``Optimizer.step#AdamW.step``) or a single ``:`` (``nccl:all_reduce``,
    ``lmprof:attn.qkv``). Operators are ``aten::mm``, ``c10d::allreduce_``, ``FlashAttnFunc``, and
    the autograd nodes ``autograd::engine::evaluate_function: MmBackward0``."""
    if name.startswith(_BACKWARD_NODE):
        return False
    if any(c.isspace() for c in name) or "#" in name:
        return True
    return ":" in name.replace("::", "")


def step_name(name: str) -> str | None:
    """``ProfilerStep#N`` for a range named like a step (see the module docstring), else None."""
    m = _STEP.fullmatch(name.strip())
    return STEP_FORMAT.format(int(m.group(1))) if m else None


def nvtx_event(text: str) -> tuple[str, str, int]:
    """(name, category, sequence number or -1) of one NVTX range's text."""
    base, seq, emitted = split_emit_nvtx(text)
    step = step_name(base)
    if step is not None:
        return step, ANNOTATION, -1
    if emitted and not is_scope_name(base):
        return base, OPERATOR, seq
    return base, ANNOTATION, seq


def runtime_name(name: str) -> str:
    """A CUDA API name without the version suffix nsys adds: ``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``."""
    return _API_VERSION.sub("", name)


def copy_name(copy_kind: int, src_kind: int, dst_kind: int) -> str:
    """Kineto's name of a copy: ``Memcpy HtoD (Pinned -> Device)``."""
    kind = COPY_KINDS.get(copy_kind, "Unknown")
    return f"Memcpy {kind} ({MEMORY_KINDS.get(src_kind, 'Unknown')} -> {MEMORY_KINDS.get(dst_kind, 'Unknown')})"


def set_name(mem_kind: int) -> str:
    """Kineto's name of a memset: ``Memset (Device)``."""
    return f"Memset ({MEMORY_KINDS.get(mem_kind, 'Unknown')})"
