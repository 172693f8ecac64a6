"""Mode auto's trials that train: the modes whose trial could change the pick (the run layer's
rule, _C.needs_no_trial) each warm up and train timed windows on the fit's own steps, in the run
layer's order; the pick (_C.choose_mode) trains the rest. A mixin of tandem.Trainer: it reads
the trainer's settings and runs its fit parts (Trainer._fit_part)."""
import copy
import math
import time
from typing import List, Optional, Tuple

import torch

from . import _C, _mode_cache
from ._fit_result import FitResult
from ._modes import MODES
from ._state import _load_optimizer_state_dict
from .optim import _TandemOptimizer

# Mode auto's trials that train (Trainer._fit_trying_modes): each mode's warm-up steps, then
# _TRIAL_WINDOWS timed windows of about _TRIAL_WINDOW_S each (within the step bounds), whose
# spread is the trial's noise.
_TRIAL_WARM_STEPS = 5
_TRIAL_WINDOW_S = 0.3
_TRIAL_WINDOWS = 2
_TRIAL_MIN_STEPS, _TRIAL_MAX_STEPS = 8, 300
_TRIAL_CLEARLY_SLOWER = 0.10  # a first window this far below the fastest: no second one
# Which modes need a trial at all is the run layer's rule (_C.needs_no_trial: pipelined+graphed
# first, then graphed only beside a pipelined+graphed step shorter than this, graphed_k only
# beside a graphed step shorter than this (None: the rule's own); serial and pipelined only where
# their graphed counterparts fail; no pipeline for a step of one stage).
_SHORT_STEP_S = None


class _TrialsThatTrain:
    """Trainer's mode auto on the fit's own steps (see Trainer.fit)."""

    # ---- mode auto's trials that train ----
    def _times_modes_itself(self) -> bool:
        """Whether mode auto is this process's to time and keep: auto, on CUDA, one process (a
        data-parallel job's ranks take rank 0's pick of the timed copies)."""
        return (self.mode == "auto" and self.world_size == 1
                and (self.device.type == "cuda" or self._trials_train_on_cpu))

    def _trials_train(self) -> bool:
        """Whether this fit decides mode auto on its own steps: timed here, not decided yet."""
        return self._trials is None and self._times_modes_itself()

    def _candidates(self) -> List[str]:
        """The modes this trainer can run, in the order mode auto times them."""
        return [m for m in _C.trial_order() if not self._mode_problem(m)]

    def _untimed_reason(self, tr, mode) -> str:
        """Why a trial of `mode` could not change the pick, given the trials so far ('' when it
        could): the run layer's rule."""
        so_far = [dict(mode=m, runs=tr["runs"][m], error=tr["errors"].get(m, ""))
                  for m in tr["candidates"] if tr["runs"][m] or m in tr["errors"]]
        extra = {} if _SHORT_STEP_S is None else dict(short_step_s=_SHORT_STEP_S)
        return _C.needs_no_trial(mode, so_far, self._stages_to_overlap(), **extra)

    def _decision_key(self) -> Optional[str]:
        """The job's key in the kept decisions (tandem/_mode_cache.py), or None where mode auto
        is not timed (an explicit mode, the CPU) or is rank 0's to make (data parallel)."""
        if not self._times_modes_itself():
            return None
        return _mode_cache.job_key(self, self._candidates())

    def _kept_decision(self):
        """Mode auto's decision from an earlier process of the same job, when one is kept."""
        if self._trials is None and self._trying is None and (key := self._decision_key()):
            self._trials = _mode_cache.load(key, self._candidates())

    def _keep_decision(self, key):
        if key and self._trials is not None:
            _mode_cache.save(key, self._trials)

    def _state(self):
        """What a trial's steps change: the modules' state_dicts, the optimizer's state and the
        random generators, copied (a mode that fails part-way is rolled back to it)."""
        modules = [m for m in (self.model, self.loss_fn, *(f for _, f in self._feeds))
                   if isinstance(m, torch.nn.Module)]
        weights = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]
        if isinstance(self.optimizer, _TandemOptimizer):
            opt = [(k, v.detach().clone()) for k, v in self.optimizer._impl.state()]
        else:
            opt = copy.deepcopy(self.optimizer.state_dict())
        gens = dict(cpu=torch.get_rng_state())
        if self.device.type == "cuda":
            gens["cuda"] = torch.cuda.get_rng_state(self.device)
        if self._augment_generator is not None:
            gens["augment"] = self._augment_generator.get_state()
        return modules, weights, opt, gens

    def _restore(self, state):
        modules, weights, opt, gens = state
        with torch.no_grad():
            for m, w in zip(modules, weights):
                m.load_state_dict(w)
        if isinstance(self.optimizer, _TandemOptimizer):
            self.optimizer._impl.load_state(opt)
        else:
            _load_optimizer_state_dict(self.optimizer, opt)
        torch.set_rng_state(gens["cpu"])
        if "cuda" in gens:
            torch.cuda.set_rng_state(gens["cuda"], self.device)
        if "augment" in gens:
            self._augment_generator.set_state(gens["augment"])

    def _next_trial_part(self, tr, left) -> Tuple[str, int, bool]:
        """The next part of the trials: (mode, steps, timed). A mode's first part warms it up
        (cuDNN's tuning, a graphed mode's warm-up steps and capture), then its timed windows,
        each sized to last _TRIAL_WINDOW_S by the last rate seen, with at most `left` steps
        (a window cut short is run untimed: the trials go on in the next fit)."""
        for mode in tr["candidates"]:
            if self._left_out(tr, mode) or self._trial_done(tr, mode):
                continue
            if mode not in tr["rate"]:
                return mode, min(_TRIAL_WARM_STEPS, left), False
            want = min(_TRIAL_MAX_STEPS, max(_TRIAL_MIN_STEPS,
                                             math.ceil(_TRIAL_WINDOW_S * tr["rate"][mode])))
            return (mode, want, True) if want <= left else (mode, left, False)
        raise AssertionError("no trial left")  # the caller decides once every mode is measured

    def _trial_done(self, tr, mode) -> bool:
        """Whether `mode` needs no more timed windows: it has _TRIAL_WINDOWS; or its first ran
        _TRIAL_CLEARLY_SLOWER below the fastest first window so far (far outside the trials'
        noise: its second window could not make it the pick, and would cost training time); or
        no other mode is left to compare it with (its one window is the fit's own training)."""
        runs = tr["runs"][mode]
        if len(runs) >= _TRIAL_WINDOWS:
            return True
        if not runs:
            return False
        best = max((r[0] for r in tr["runs"].values() if r), default=0.0)
        if runs[0] < best * (1 - _TRIAL_CLEARLY_SLOWER):
            return True
        return all(m == mode or self._left_out(tr, m) for m in tr["candidates"])

    def _left_out(self, tr, mode) -> bool:
        """Whether `mode` is out of the trials: it failed, or, not timed yet, needs no trial."""
        return mode in tr["errors"] or (not tr["runs"][mode]
                                        and bool(self._untimed_reason(tr, mode)))

    def _trials_finished(self, tr) -> bool:
        """Whether every mode is measured, failed, or needs no trial."""
        return all(self._left_out(tr, m) or self._trial_done(tr, m) for m in tr["candidates"])

    def _fit_trying_modes(self, n, progress, trace) -> FitResult:
        """Mode auto on the fit's own steps: each mode the optimizer and schedule allow whose
        trial could change the pick (_untimed_reason) trains a few warm-up steps, then its timed
        windows, in turn, on your modules (every mode
        computes the plain loop's losses, so the steps are the fit's own); the run layer's rule
        picks among the rates (the simplest within the windows' noise of the fastest), and the
        rest of the fit — and every later fit — trains in that mode on the loop its trial kept
        (its graphs captured). A fit too short for them all goes on with them in the next. A mode
        that fails is rolled back to where its trial started and left out, naming why."""
        started = time.perf_counter()
        tr = self._trying
        if tr is None:
            tr = self._trying = dict(candidates=self._candidates(), runs={}, rate={}, errors={},
                                     seconds=0.0, steps=0, key=self._decision_key())
            for m in tr["candidates"]:
                tr["runs"][m] = []
        losses, parts, reports, left = [], [], [], n
        while left > 0 and self._trials is None:
            mode, k, timed = self._next_trial_part(tr, left)
            state = self._state() if mode not in tr["rate"] else None
            part_start = time.perf_counter()
            try:
                report = self._fit_part(mode, k, progress, trace)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - the mode is left out, the fit goes on
                if state is None:
                    raise  # a mode that ran before failed now: not the trial's to hide
                self._restore(state)
                first_line = str(e).splitlines()[0] if str(e) else ""
                tr["errors"][mode] = f"{type(e).__name__}: {first_line}"
                if all(m in tr["errors"] for m in tr["candidates"]):
                    raise
                if self._trials_finished(tr):
                    self._decide(tr)
                continue
            finally:
                tr["seconds"] += time.perf_counter() - part_start
            tr["steps"] += k
            left -= k
            losses += report["losses"]
            reports.append(report)
            rate = k / report["seconds"] if report["seconds"] > 0 else 0.0
            parts.append(dict(mode=mode, steps=k, seconds=report["seconds"], timed=timed,
                              trial=True))
            if rate > 0:
                tr["rate"][mode] = rate
                if timed:
                    tr["runs"][mode].append(rate)
            if self._trials_finished(tr):
                self._decide(tr)
        if left > 0:  # decided: the rest on the picked mode's kept loop
            mode = self._trials["mode"]
            report = self._fit_part(mode, left, progress, trace)
            losses += report["losses"]
            reports.append(report)
            parts.append(dict(mode=mode, steps=left, seconds=report["seconds"], timed=False,
                              trial=False))
        return self._parts_result(reports, parts, losses, n, time.perf_counter() - started)

    def _decide(self, tr):
        """The pick among the trials, every mode listed simplest first: its windows' rates, or
        why it failed, was not timed (the run layer's rule) or cannot run here."""
        trials = []
        for m in MODES[1:]:
            if m not in tr["candidates"]:
                error = self._mode_problem(m)
            elif tr["runs"][m] or m in tr["errors"]:
                error = tr["errors"].get(m, "")
            else:
                error = "not timed: " + self._untimed_reason(tr, m)
            trials.append(dict(mode=m, runs=tr["runs"].get(m, []), error=error,
                               steps_per_s=min(tr["runs"][m]) if tr["runs"].get(m) else None))
        picked = _C.choose_mode(trials)
        self._trials = dict(mode=picked["mode"], reason=picked["reason"],
                            trials=trials, seconds=tr["seconds"],
                            steps=tr["steps"], on_the_fits_steps=True)
        self._trying = None
        self._keep_decision(tr["key"])
        for m in list(self._sessions):  # the others' loops (and graphs) go
            if m != picked["mode"]:
                del self._sessions[m]

    def _parts_result(self, reports, parts, losses, n, seconds) -> FitResult:
        """One FitResult of a fit made of several runs (trial parts, then the picked mode's):
        the last run's report and table, every part listed, the setups summed."""
        report = dict(reports[-1])
        report.pop("losses", None)
        table = report.pop("table")
        setups = [r.get("setup") or {} for r in reports]
        trials = [p for p in parts if p["trial"]]
        setup = dict(trials_s=sum(p["seconds"] for p in trials),
                     trial_steps=sum(p["steps"] for p in trials),
                     prepare_s=sum(x.get("prepare_s", 0) for x in setups),
                     capture_s=sum(x.get("capture_s", 0) for x in setups),
                     graphs=sum(x.get("graphs", 0) for x in setups),
                     graphs_kept=setups[-1].get("graphs_kept", 0))
        report["parts"] = parts
        rows = ", ".join(f"{p['mode']} {p['steps']}" + (" timed" if p["timed"] else "")
                         for p in parts)
        table += f"\nthis fit's runs (mode, steps): {rows}"
        mode = self._trials["mode"] if self._trials else parts[-1]["mode"]
        return FitResult(losses=losses, mode=mode, steps=n, seconds=seconds,
                         steps_per_s=n / seconds if seconds > 0 else 0.0,
                         samples_per_s=n * self.batch_size / seconds if seconds > 0 else 0.0,
                         table=table, report=report, trials=self._trials, setup=setup)
