"""What Trainer.fit and Trainer.benchmark return."""
import dataclasses
from typing import List, Optional


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


@dataclasses.dataclass
class FitResult:
    """What a fit (or a benchmark) did. ``report`` is the CLI's JSON report (`tandem bench
    --json`): per-stage host and device times, the floor (the slowest stage) and efficiency,
    GPU utilization, the runner's notes. ``print(result)`` shows the CLI's table, mode auto's
    pick and where the call's seconds beside its steps went (``setup``)."""
    losses: List[float]
    mode: str
    steps: int
    seconds: float
    steps_per_s: float
    samples_per_s: float
    report: dict
    table: str
    trials: Optional[dict] = None  # mode auto: every mode's trial rate and why one was picked
    # What this call paid besides its steps: trials_s (mode auto's trials in this call: on CUDA
    # in fit, the seconds of its own steps that ran as trials, trial_steps of them, which
    # trained; on timed copies elsewhere; 0 once decided), prepare_s (the runs' loader, lanes
    # and pipeline), capture_s (their CUDA graphs recorded and instantiated), graphs (how many)
    # and graphs_kept (an earlier fit's, replayed from this one's first step); a fit's also
    # conv_plans (its convolutions' cuDNN plans: convolutions run on them, plans tuned and
    # tuning_s spent timing them, from_file rebuilt from the plans file untimed in rebuilding_s;
    # of both, listing_s on their graphs (graph_s of it) and cuDNN's candidate lists and
    # building_s on plans built; runtime_compiled those whose engine compiled its kernel here,
    # from_compiled those of from_file restored with their compiled code, configured those of
    # from_file whose kept engine was configured without cuDNN's candidate lists, prebuilt those
    # of from_file built on several threads before the first step, warmup_ops and warmup_s what
    # the thread beside them that loads the step's other kernels ran and took; {} where they do
    # not apply).
    setup: Optional[dict] = None
    # A fit with a run folder: every epoch's record (metrics.jsonl's rows, a resumed run's
    # earlier ones included), the final weights' file and the newest checkpoint's folder.
    epochs: Optional[List[dict]] = None
    weights: Optional[str] = None
    checkpoint: Optional[str] = None

    def __str__(self) -> str:
        text = self.table
        if self.trials:
            rows = ", ".join(f"{t['mode']} {t['steps_per_s']:.1f}" if t["steps_per_s"]
                             else f"{t['mode']} " + ("not timed" if (t.get("error") or "").startswith(
                                 "not timed") else "failed") for t in self.trials["trials"])
            text += f"\nauto: {self.trials['reason']}" + (f" (trials, steps/s: {rows})"
                                                          if rows else "")
        paid = self._setup_line()
        return text + f"\nsetup: {paid}" if paid else text

    def _setup_line(self) -> str:
        """Where this call's seconds beside its steps went, in a line: the trials, the graphs'
        capture and the convolutions' plans (empty where it paid none of them)."""
        s = self.setup or {}
        parts = []
        if s.get("trials_s", 0) >= 0.005:
            steps = s.get("trial_steps")  # a fit's trials on CUDA train: its own steps
            parts.append(f"mode auto's trials {s['trials_s']:.2f} s"
                         + (f" ({_count(steps, 'step')} of the fit's)" if steps else ""))
        if s.get("graphs"):
            captured = _count(s["graphs"], "graph")
            parts.append(f"{captured} captured in {s.get('capture_s', 0):.2f} s")
        elif s.get("graphs_kept"):
            parts.append(f"{_count(s['graphs_kept'], 'kept graph')} replayed")
        plans = s.get("conv_plans") or {}
        if plans.get("tuned"):
            compiled = plans.get("runtime_compiled", 0)
            parts.append(f"{plans['tuned']} cuDNN convolution plans timed in "
                         f"{plans.get('tuning_s', 0):.2f} s"
                         + (f" ({compiled} compiled at run time)" if compiled else "")
                         + ", kept for later processes")
        if plans.get("from_file"):
            restored, ahead = plans.get("from_compiled", 0), plans.get("prebuilt", 0)
            parts.append(f"{plans['from_file']} kept plans rebuilt in "
                         f"{plans.get('rebuilding_s', 0):.2f} s"
                         + (f" ({restored} with their compiled code)" if restored else "")
                         + (f", {ahead} of them ahead on threads" if ahead else ""))
        return "; ".join(parts)
