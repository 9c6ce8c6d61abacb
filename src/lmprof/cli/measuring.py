"""The options every verb that measures a built-in run shares (``lmprof train``, ``lmprof infer``), declared once.

A verb takes them as one :class:`Measuring` parameter, and :func:`measuring_options` shows typer the
options themselves in its place: their names, defaults and help are the same for every such verb,
and so is what the verb does with them (the YAML they override, the checks before torch is imported,
the run shown and exported at the end).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, List, Optional, TypeVar, get_type_hints

import typer


_F = TypeVar("_F", bound=Callable[..., None])

# The default a verb writes for its ``opts: Measuring`` (keeping its place among the options, which is
# where --help lists the shared ones); :func:`measuring_options` always passes the options given.
GIVEN: Any = None


def _option(default: Any, *decls: str, help: str, first: bool = False) -> Any:
    # first: --help lists the option before the verb's own (which model), else where the verb has ``opts``.
    return field(metadata={"option": typer.Option(default, *decls, help=help), "first": first})


@dataclass(frozen=True)
class Measuring:
    """The shared options as given on the command line (None: not given, the YAML's or the default)."""

    preset: Optional[str] = _option(None, help="Built-in GPT preset: tiny, small or gpt2 [default: tiny]", first=True)
    hf: Optional[str] = _option(None, "--hf", help="Hugging Face model: local folder or cached hub id", first=True)
    hf_config: Optional[str] = _option(None, "--hf-config", help="Hugging Face architecture with random weights "
                                       "(gpt2, tiny-llama, ...) or a config.json", first=True)
    energy: Optional[str] = _option(None, help="auto, off or estimate [default: auto]")
    tdp_w: Optional[float] = _option(None, "--tdp-w", help="Rated power (W) for --energy estimate")
    config: Optional[Path] = _option(None, "--config", "-c", help="YAML file with any of these options")
    out: Optional[str] = _option(None, help="Folder that receives the run folder [default: runs]")
    report: bool = _option(True, "--report/--no-report", help="Write report.html into the run folder")
    verbose: bool = _option(False, "--verbose", help="Also show torch's own C++ log lines (kineto's "
                            "profiler_start/stop, allocator warnings)")
    plots: Optional[bool] = _option(None, "--plots/--no-plots", help="Draw roofline.png and memory.png "
                                    "[default: with the report or --log-to]")
    log_to: List[str] = _option([], "--log-to", help="Also export the run to tensorboard, mlflow or wandb "
                                "(repeatable; offline, default destinations: docs/trackers.md)")
    force: Optional[bool] = _option(None, "--force", help="Run even when the steps asked for would take over "
                                    "an hour")

    def values(self, **flags: Any) -> dict[str, Any]:
        """The run's values: the ``--config`` YAML, overridden by the flags given (the verb's and these),
        with the plots decided: ``--plots/--no-plots`` when given, else the YAML's, else with the report or a tracker."""
        from lmprof.config import load_yaml

        given = load_yaml(self.config)
        # A flag left None was not given: the YAML's value, or the spec's default, stands.
        flags.update(preset=self.preset, hf=self.hf, hf_config=self.hf_config, energy=self.energy, tdp_w=self.tdp_w,
                     out=self.out, force=self.force)
        given.update({k: v for k, v in flags.items() if v is not None})
        if self.plots is not None:
            given["plots"] = self.plots
        else:  # on only when something shows the PNGs (the report, a tracker): drawing them costs seconds a run
            given.setdefault("plots", self.report or bool(self.log_to))
        return given

    def check(self, cfg: Any, out: Path | str, flag: str = "--out") -> None:
        """What was given, checked before torch is imported so that a refusal is one quick line: the
        output folder, the trackers (a missing package too) and the built-in GPT's preset."""
        from lmprof.outdir import check_output_dir

        check_output_dir(out, flag)
        if self.log_to:
            from lmprof.trackers.export import check_trackers

            check_trackers(self.log_to)
        if not (cfg.hf or cfg.hf_config):
            from lmprof.workloads.gpt_config import check_preset

            check_preset(cfg.preset)


def measuring_options(verb: _F) -> _F:
    """Give typer the :class:`Measuring` options in place of ``verb``'s ``opts: Measuring`` parameter,
    and call ``verb`` with them gathered into one."""
    signature = inspect.signature(verb, eval_str=True)
    names = [f.name for f in fields(Measuring)]
    types = get_type_hints(Measuring)
    shared = {f.name: inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["option"],
                                        annotation=types[f.name]) for f in fields(Measuring)}
    first = [shared[f.name] for f in fields(Measuring) if f.metadata["first"]]
    rest = [shared[f.name] for f in fields(Measuring) if not f.metadata["first"]]
    params = list(first)
    for p in signature.parameters.values():
        params.extend(rest if p.name == "opts" else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)])

    @functools.wraps(verb)
    def command(**kwargs: Any) -> None:
        opts = Measuring(**{name: kwargs.pop(name) for name in names})
        verb(**kwargs, opts=opts)

    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return command  # type: ignore[return-value]
