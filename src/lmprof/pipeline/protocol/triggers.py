"""Where step boundaries come from when the user's code is not changed.

* Training: torch.optim's global optimizer-step hooks. At the first optimizer step, the model is
  found as the module holding the most of the optimizer's parameters (the outermost one on a tie,
  unwrapped from DDP and torch.compile); with several optimizers, steps are those of the largest, and
  every one that steps the model's parameters (Muon for its matrices, AdamW for the rest) has its step
  in the ``optimizer`` phase, its state in the memory figures and its ``zero_grad`` scoped. A largest
  one that has not stepped, its model running no forward, by another's second step is not the loop's
  (created and left): the choice goes to the largest that stepped, before anything was measured. An
  optimizer created later that holds all of its parameters replaces it (one re-created every epoch).
  An optimizer step with no forward of the model since the last boundary (``opt.step()`` twice per
  batch) ends no step: it belongs to the next one, so a step stays one pass of the loop. A
  ``GradScaler.step(opt)`` that skips ``opt.step()`` (inf or NaN gradients, as fp16 training has now
  and then) ends a step all the same: ``GradScaler.step`` is patched on the class while the session runs.
* Inference: ``transformers``' ``GenerationMixin.generate``, patched on the class while the session
  runs, and the ``generate`` of every model class the script defines with one of its own (nanoGPT's,
  minGPT's: wrapped as the class is created, through ``torch.nn.Module.__init_subclass__``, restored at
  the end): each call is a generation, the receiver is the model; a forward hook on the model marks the
  end of each of its top-level forwards (timing.py: :func:`hook_forward_ends`).
"""
from __future__ import annotations

import functools
import gc
import inspect
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from lmprof.pipeline.protocol.guard import run_guarded
from lmprof.workloads.stepping import param_ids, params
from lmprof.patch import Patch
from lmprof.workloads.hooks import takes_hooks, unwrap
from lmprof.workloads.live import live_objects

if TYPE_CHECKING:
    from lmprof.pipeline.protocol.session import Session


def _n_params(opt: torch.optim.Optimizer) -> int:
    return sum(p.numel() for p in params(opt))


def _named(opts: list[torch.optim.Optimizer]) -> str:
    """The first few of ``opts``, each with its class and parameter count, for a note."""
    return ", ".join(f"{type(o).__name__} ({_n_params(o):,} params)" for o in opts[:3])


def _holders(opt: torch.optim.Optimizer, live: list[Any]) -> tuple[torch.nn.Module | None, bool]:
    """The outermost module holding the most of ``opt``'s parameters, and whether another module holds
    some of them without being inside it (a second model sharing them, or a dead one not yet collected)."""
    wanted = param_ids(opt)
    best: tuple[tuple[int, int], torch.nn.Module] | None = None
    holders: list[torch.nn.Module] = []
    for obj in live:
        if not isinstance(obj, torch.nn.Module):
            continue
        covered = sum(1 for p in obj.parameters() if id(p) in wanted)
        if not covered:
            continue
        holders.append(obj)
        key = (covered, sum(1 for _ in obj.modules()))  # ties: the outermost (most submodules)
        if best is None or key > best[0]:
            best = (key, obj)
    if best is None:
        return None, False
    inside = {id(m) for m in best[1].modules()}
    return best[1], any(id(m) not in inside for m in holders)


def _choice(stepped: torch.optim.Optimizer, live: list[Any]) -> tuple[list[torch.optim.Optimizer], torch.nn.Module | None, bool]:
    """The optimizers whose steps run the hooks (largest first), the model of the largest, and whether
    the scan was ambiguous. Only optimizers whose step runs these hooks count: a wrapper (accelerate's
    AcceleratedOptimizer) shares the inner optimizer's groups but steps through it."""
    opts = [o for o in live if isinstance(o, torch.optim.Optimizer) and getattr(type(o).step, "hooked", False)]
    if not any(o is stepped for o in opts):
        opts.append(stepped)
    opts.sort(key=_n_params, reverse=True)
    model, shared = _holders(opts[0], live)
    return opts, model, len(opts) > 1 or shared


def _in_session(fn: Any) -> Any:
    """A trigger's hook, guarded as the session's own methods are: it runs inside the user's
    ``optimizer.step()``, so nothing it raises may reach it (the session ends, with one line)."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run_guarded(self.session, fn, self, *args, **kwargs)

    return wrapper


class OptimizerTrigger:
    """Step boundaries from every torch.optim optimizer step (global hooks).

    With ``boundaries=False`` (``lmprof.profile``, the Trainer callback: steps come from elsewhere)
    the hooks only place the ``optimizer`` scope in the profiled window.
    """

    def __init__(self, session: "Session", boundaries: bool = True):
        self.session = session
        self.boundaries = boundaries
        self.chosen: torch.optim.Optimizer | None = None
        self._handles: list[Any] = []
        # boundaries=False: optimizers judged to step the session's model, or not (another thread's, another model's)
        self._ours: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        self._replaces: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        # Steps each optimizer took (ran or skipped by a scaler) until the chosen one first steps
        self._stepped: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self._chosen_stepped = False
        self._choice_notes: list[str] = []  # the notes the choice wrote (a re-choice takes them back)
        self._forward_hook: Any = None  # the model's forward pre-hook: a forward ran since the last boundary
        self._forward_since = self._forward_seen = False
        self._last_stepped: Any = None  # the optimizer the post hook saw last (a scaler's step ran it)
        self._skips = 0  # optimizer steps the GradScaler skipped
        self._scaler: Patch | None = None  # GradScaler.step, patched while the session runs

    def install(self) -> None:
        self._handles = [register_optimizer_step_pre_hook(self._pre_hook),
                         register_optimizer_step_post_hook(self._post_hook)]
        if self.boundaries:
            self._patch_scaler()
        self.session.on_done(self.remove)

    def _patch_scaler(self) -> None:
        """Patch ``GradScaler.step``: when it skips the optimizer's step (inf or NaN gradients), no
        optimizer hook runs, and without this the loop's pass and the next one would be one step (twice
        the tokens, a backward too many, shapes said to vary)."""
        from torch.amp.grad_scaler import GradScaler

        trigger = self

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
                if trigger.session.done:
                    return original(scaler, optimizer, *args, **kwargs)
                trigger._last_stepped = None
                out = original(scaler, optimizer, *args, **kwargs)
                if trigger._last_stepped is not optimizer:
                    trigger._skipped(optimizer)
                return out

            return step

        self._scaler = Patch(GradScaler, "step", wrap)
        self._scaler.install()  # remove() restores it

    # The hooks run in every optimizer step of the user's loop until it ends. After the profiled window
    # they have nothing to do unless a capture records (or, with boundaries, the post hook marks them):
    # they return before the guard and the rest, a few µs a step that the whole-run watch counts.
    # While scopes record, the hooks' own work is in lmprof's own range (ScopeStack.own): from the pre hook's
    # start to the optimizer's scope, from its end to the step's; else it would read as the user's loop.
    def _pre_hook(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            return  # dynamo traces a compiled optimizer step (below)
        if self._scoping():
            self._pre(opt)

    def _post_hook(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            # A loop that compiles its optimizer step (PyTorch's "compiling the optimizer" recipe): dynamo
            # traces the hooks into its graph, where they are nothing; lmprof sees no such step
            return
        self._last_stepped = opt
        scoping = self._scoping()
        if self.boundaries or scoping:
            self._post(opt, args, kwargs)
        if scoping:
            self._end_own()  # a step that did not end here (another optimizer's): what follows is the user's

    def remove(self) -> None:
        if self.chosen is not None and not self._chosen_stepped and self._stepped:
            others = ", ".join(f"{type(o).__name__}: {n} step{'s' if n > 1 else ''}"
                               for o, n in list(self._stepped.items())[:3])
            if max(self._stepped.values()) < 2:
                why = "one pass of the loop is too few to tell which optimizer is the loop's, or to time a step"
            elif self._forward_seen:
                why = "its model ran forwards, so it was kept as the loop's"
            else:
                why = ("its model takes no hook (compiled or TorchScript: nothing tells whether it ran), so it was "
                       "kept as the loop's")
            self.session.observed.unstepped = (
                f"steps end at the largest optimizer's, {type(self.chosen).__name__} ({_n_params(self.chosen):,} "
                f"params), which never stepped, while others did ({others}); {why} (for a loop whose steps are "
                "another optimizer's, use lmprof.profile(model) and call prof.step() after each step)")
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._scaler is not None:
            self._scaler.remove()
        self._drop_forward_hook()

    def _drop_forward_hook(self) -> None:
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def _steps_model(self, opt: torch.optim.Optimizer) -> bool:
        """Whether ``opt`` holds a parameter of the session's model (the hooks are global: another
        thread's or another model's optimizer steps through them too); judged once per optimizer."""
        known = self._ours.get(opt)
        if known is None:
            model = self.session.observed.model
            known = model is None or not {id(p) for p in model.parameters()}.isdisjoint(param_ids(opt))
            self._ours[opt] = known
        return known

    def _scoping(self) -> bool:
        """Whether an optimizer step's scope has a recording to go into: always before the profiled window
        is collected; after it, only while a window records (a capture of the whole-run watch)."""
        if not self.session.collected:
            return True
        for w in self.session.windows.more:
            if w.probes() is not None:
                return True
        return False

    def _counts(self, opt: torch.optim.Optimizer) -> bool:
        """Whether ``opt``'s step is part of the model's training step: the chosen optimizer, or
        (once a model is known) any optimizer that steps its parameters."""
        if self.boundaries and (opt is self.chosen or self.chosen is None or self.session.observed.model is None):
            return opt is self.chosen
        return self._steps_model(opt)

    @_in_session
    def _pre(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer step begins (called by _pre_hook, while :meth:`_scoping`): its scope opens in the
        probes that record."""
        with self.session.windows.own_work() as recording:
            if self._counts(opt):
                for p in recording:
                    p.optimizer_begin()

    @_in_session
    def _end_own(self) -> None:
        for p in self.session.windows.recording():
            p.scopes.end_own()

    def _optimizer_ended(self) -> None:
        for p in self.session.windows.recording():
            p.optimizer_end()

    @_in_session
    def _post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """An optimizer step ended (called by _post_hook: always with boundaries, else while :meth:`_scoping`)."""
        if not self.boundaries:
            if not self._steps_model(opt):
                return
            self._optimizer_ended()
            if not any(o is opt for o in self.session.observed.optimizers):
                self.session.observed.optimizers.append(opt)  # its zero_grad gets a scope in the window
            return
        self._step_ended(opt, ran=True)

    @_in_session
    def _skipped(self, opt: torch.optim.Optimizer) -> None:
        """``GradScaler.step(opt)`` skipped ``opt.step()``: the loop's pass ended all the same."""
        if self.chosen is None:
            self._choose(opt)
        if opt is self.chosen and not self.session.collected:  # a skipped step of those the figures come from
            self._skips += 1
            notes = self.session.observed.notes
            note = (f"the GradScaler skipped {self._skips} optimizer step(s) before the profiled window ended (inf "
                    "or NaN gradients: fp16 loss scaling skips those steps); each still ended a step of the loop")
            at = next((i for i, n in enumerate(notes) if n.startswith("the GradScaler skipped")), None)
            if at is None:
                notes.append(note)
            else:
                notes[at] = note
        self._step_ended(opt, ran=False)  # before the boundary it may bring: the run may be written there

    def _step_ended(self, opt: torch.optim.Optimizer, ran: bool) -> None:
        """An optimizer step ended (``ran``) or was skipped: the chosen optimizer's ends a step."""
        if not self._chosen_stepped:
            self._stepped[opt] = self._stepped.get(opt, 0) + 1
        if self.chosen is None:
            self._choose(opt)
        elif opt is not self.chosen and self._replaces_chosen(opt):
            self._replace(opt)
        elif opt is not self.chosen and self._chosen_idle(opt):
            self._rechoose(opt)
        if opt is self.chosen and not self._chosen_stepped:
            self._chosen_stepped = True
            self._stepped = weakref.WeakKeyDictionary()  # needed no more
        if ran and self._counts(opt):
            if self._scoping():
                self._optimizer_ended()
            if not any(o is opt for o in self.session.observed.optimizers):
                self.session.observed.optimizers.append(opt)  # one created later: its state and zero_grad count
        if opt is self.chosen:
            if self._forward_seen and not self._forward_since:
                return  # no forward of the model since the last boundary: this step belongs to the next one
            self._forward_since = False
            self.session.boundary()

    def _forward_ran(self, module: torch.nn.Module, args: Any) -> None:
        self._forward_since = self._forward_seen = True

    def _replaces_chosen(self, opt: torch.optim.Optimizer) -> bool:
        """Whether ``opt`` steps every parameter the chosen optimizer steps (it was re-created); judged
        once per optimizer."""
        known = self._replaces.get(opt)
        if known is None:
            assert self.chosen is not None
            known = param_ids(self.chosen) <= param_ids(opt)
            self._replaces[opt] = known
        return known

    def _replace(self, opt: torch.optim.Optimizer) -> None:
        """A re-created optimizer takes the chosen one's place (the old one is let go: its state is the
        user's memory, not lmprof's)."""
        old, self.chosen = self.chosen, opt
        seen = self.session.observed
        seen.optimizers = [opt if o is old else o for o in seen.optimizers]
        seen.optimizer_replaced = (type(old).__name__, self.session.k)
        if not any(n.startswith("the optimizer was re-created") for n in seen.notes):
            seen.notes.append(f"the optimizer was re-created during the run (a new {type(opt).__name__} holding "
                              "the same parameters): its steps are counted as the first one's were")

    def _chosen_idle(self, opt: torch.optim.Optimizer) -> bool:
        """Whether the chosen optimizer is one the loop does not use (created and left, a larger one than
        the loop's): it has not stepped, its model ran no forward, and ``opt`` has now stepped twice, so a
        whole pass of the loop went by without it. A GAN's generator optimizer, chosen while the critic
        steps several times first (WGAN's n_critic), stays: its model ran forwards for the critic's input.
        With no forward hook (a compiled or TorchScript model) there is no telling, and the choice stays."""
        if self._chosen_stepped or self._stepped.get(opt, 0) < 2 or self._forward_seen:
            return False
        return self._forward_hook is not None or self.session.observed.model is None

    def _rechoose(self, again: torch.optim.Optimizer) -> None:
        """``again`` stepped twice: the choice goes to the largest of the optimizers that stepped. The first one's
        model, hooks, windows' set-up and notes (the choice's and its attach's) are taken back (nothing was
        measured: no step of the chosen one ever ended)."""
        idle = self.chosen
        assert idle is not None
        self._drop_forward_hook()
        had_model = self.session.observed.model is not None
        self.session.windows.detached()
        self.session.observed.detach()
        notes = self.session.observed.notes
        notes[:] = [n for n in notes if not any(n is c for c in self._choice_notes)]
        self._ours, self._replaces = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()
        stepped = list(self._stepped)
        self.chosen = None
        self._choose(stepped[0], among=stepped)
        unused = "its model ran no forward" if had_model else "no module holds its parameters"
        self._choice_notes.append(f"{type(idle).__name__} ({_n_params(idle):,} params), the largest optimizer when "
                                  f"the first step ended, never stepped and {unused} while "
                                  f"{type(again).__name__} stepped twice: steps end at the largest of those "
                                  "that stepped")
        notes.append(self._choice_notes[-1])

    def _choose(self, stepped: torch.optim.Optimizer, among: list[torch.optim.Optimizer] | None = None) -> None:
        """Choose the optimizer whose steps end the loop's steps, and its model: the largest of the live
        hooked optimizers (``among``: of these only)."""
        def live() -> list[Any]:
            found = live_objects(torch.nn.Module, torch.optim.Optimizer)
            if among is None:
                return found
            return [o for o in found if not isinstance(o, torch.optim.Optimizer) or any(o is a for a in among)]

        opts, model, ambiguous = _choice(stepped, live())
        if ambiguous:
            # Optimizers and models of code that already finished must not be counted: a reference
            # cycle keeps them alive until a collection (0.15-0.3 s), paid only when they could matter.
            del opts, model  # (held here, they would survive it)
            gc.collect()
            opts, model, _ = _choice(stepped, live())
        self.chosen = opts[0]
        called = model
        model, compiled = (None, False) if model is None else unwrap(model)
        s, notes = self.session, self.session.observed.notes
        before = len(notes)
        if model is None:
            notes.append("no nn.Module holds the optimizer's parameters: no block scopes, forward shows as 'other'")
            s.observed.device = _device_of_params(self.chosen)
        else:
            s.attach(model, [self.chosen], compiled=compiled, outer=called)
            s.observed.optimizers += [o for o in opts[1:] if self._steps_model(o)]
            notes.append(f"model: {type(model).__name__}, the module holding the optimizer's parameters")
            if not compiled and takes_hooks(model):  # a hook in a compiled model would recompile it
                self._forward_hook = model.register_forward_pre_hook(self._forward_ran)
        if len(opts) > 1:
            mine = s.observed.optimizers[1:] if model is not None else []
            also = [o for o in opts[1:] if not any(o is m for m in mine)]
            notes.append(f"{len(opts)} optimizers: steps end at the largest's, {type(self.chosen).__name__} "
                         f"({_n_params(self.chosen):,} params)"
                         + (f"; also training the model, their steps in 'optimizer' and their state in memory: "
                            f"{_named(mine)}" if mine else "")
                         + (f"; also present, not stepping the model: {_named(also)}" if also else ""))
        if compiled:
            notes.append("torch.compile: the model is compiled, so lmprof placed no hooks in it (they would force "
                           "a recompilation): its forward is not split into blocks and shows as step 'other'")
        self._choice_notes = notes[before:]


def _device_of_params(opt: torch.optim.Optimizer) -> Any:
    from lmprof.hardware.devices import resolve_device

    p = next(iter(params(opt)), None)
    return resolve_device(str(p.device) if p is not None else "cpu")


class GenerateTrigger:
    """Generations from a ``generate`` method: ``transformers``' ``GenerationMixin.generate`` (class patched
    while the session runs), and that of every model class the script defines with a ``generate`` of its own
    (nanoGPT's and minGPT's sample loops: wrapped as the class is created, while the session runs)."""

    def __init__(self, session: "Session"):
        self.session = session
        self._patch: Patch | None = None
        self._depth = 0  # generate calling generate (assisted decoding, an override calling super): one
        self._classes: list[tuple[Any, Any]] = []  # model classes whose own generate is wrapped
        self._hooked: Any = None  # the __init_subclass__ lmprof set on torch.nn.Module (None: not set)
        self._had_hook: Any = None  # torch.nn.Module's own __init_subclass__, where it has one

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        session = self.session

        @functools.wraps(original)
        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            if self._depth or session.done:
                return original(model, *args, **kwargs)
            self._depth += 1
            session.generation_begin(model, args, kwargs)
            out = None
            try:
                out = original(model, *args, **kwargs)
                return out
            finally:
                self._depth -= 1
                session.generation_end(out)  # its sequences say how many tokens it made

        return generate

    def install(self) -> bool:
        """Patch ``GenerationMixin.generate`` where transformers is installed, and wrap the ``generate`` of
        model classes created from now on; always True (a script's own model may generate)."""
        try:
            from transformers.generation.utils import GenerationMixin
        except ImportError:
            pass
        else:
            self._patch = Patch(GenerationMixin, "generate", self._wrap)
            self._patch.install()  # wraps transformers' method; remove() restores it
        self._hook_classes()
        self.session.on_done(self.remove)
        return True

    def _hook_classes(self) -> None:
        module = torch.nn.Module
        self._had_hook = vars(module).get("__init_subclass__")
        trigger = self

        def init_subclass(cls: Any, /, **kwargs: Any) -> None:
            if trigger._had_hook is not None:
                trigger._had_hook.__get__(None, cls)(**kwargs)
            else:
                super(module, cls).__init_subclass__(**kwargs)  # type: ignore[misc]  # cls is a subclass being made
            own = vars(cls).get("generate")
            if inspect.isfunction(own) and not trigger.session.done:
                cls.generate = trigger._wrap(own)
                trigger._classes.append((cls, own))

        self._hooked = classmethod(init_subclass)
        module.__init_subclass__ = self._hooked  # type: ignore[method-assign]

    def remove(self) -> None:
        if self._patch is not None:
            self._patch.remove()
            self._patch = None
        module = torch.nn.Module
        if self._hooked is not None and vars(module).get("__init_subclass__") is self._hooked:
            if self._had_hook is not None:
                module.__init_subclass__ = self._had_hook  # type: ignore[method-assign]
            else:
                delattr(module, "__init_subclass__")
        self._hooked = None
        for cls, own in self._classes:
            if getattr(vars(cls).get("generate"), "__wrapped__", None) is own:
                cls.generate = own  # the class as the script defined it
        self._classes.clear()
