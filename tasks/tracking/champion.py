"""The champion of a (model, version label, cluster): which registered version the registry
names, when a strategy takes that name, and when its holder regressed. Pure rules on measured
numbers; tasks/champion.py reads and writes the registry.

MLflow's convention names the version to deploy `champion`. One registered model here holds
every label and cluster of a model (wide_fc's page lists all its versions, tagged
`model_version`, `strategy` and `cluster`, which is what `compare` reads across labels), so
the alias carries the label and the cluster: `models:/wide_fc@champion-v1-local`. A registered
name per (model, label, cluster) would allow a bare `champion`, but would scatter one model's
versions over names that encode what tags already say.

The rule, on steps measured in one benchmark run (the median step after the warm-up):
- eligible: a strategy that passed its checks (accuracy, exactness) and is not over the
  declared device memory; the others never take the alias;
- the first run of a (model, label, cluster) crowns its fastest eligible strategy;
- later, the fastest eligible strategy other than the champion's takes the alias only when its
  step is at least `margin` shorter than the champion strategy's step measured in the same run,
  or, when that strategy did not run, than the champion's recorded step (the standing says
  which). This is MLflow's MetricThreshold(min_relative_change=margin,
  greater_is_better=False), written out: MetricThreshold judges evaluation results, by raising,
  and takes a zero margin as no comparison at all;
- the champion's strategy does not challenge its own version: the alias stays on the version
  that won, whose recorded step is the regression guard's reference (moving it to each night's
  version would let a slow drift pass unseen);
- regression: the champion's strategy measured in this run more than `margin` slower than the
  champion's recorded step, even in the faster quarter of its steps (its first quartile), so
  that the spread of one run's steps (wide on a shared CPU) fails no nightly by itself.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Champion(BaseModel):
    """The version an alias names: its strategy and the step its run measured."""

    model_config = ConfigDict(frozen=True)

    version: str
    strategy: str
    step_seconds: float


class Measured(BaseModel):
    """One strategy of this benchmark run, registered as `version`: its measured step, its
    measured speed-up over data parallelism in the same run (None: data did not run), and why
    it may not be champion (None: eligible)."""

    model_config = ConfigDict(frozen=True)

    strategy: str
    version: str
    step_seconds: float
    # the first quartile of its steps, what the regression rule reads (None: the median)
    first_quartile_seconds: float | None = None
    speedup: float | None = None
    ineligible: str | None = None


class Standing(BaseModel):
    """The verdict of one benchmark run for one (model, label, cluster): the champion before
    and after, the strategy that challenged it (the fastest eligible other than the previous
    champion's) and the step it was measured against, and a regression of the champion."""

    model_config = ConfigDict(frozen=True)

    model: str
    label: str
    cluster: str
    alias: str
    margin: float
    previous: Champion | None
    champion: Champion | None
    challenger: Measured | None
    reference_seconds: float | None  # the previous champion's step the challenger faced
    reference_recorded: bool = False  # its recorded step: its strategy did not run
    regression: str | None = None

    @property
    def where(self) -> str:
        return f"{self.model} {self.label} on {self.cluster}"

    @property
    def moved(self) -> bool:
        return self.champion is not None and self.champion != self.previous


def beats(step_seconds: float, reference_seconds: float, margin: float) -> bool:
    """Whether a step is at least `margin` (a share) shorter than the reference."""
    return step_seconds <= reference_seconds * (1 - margin)


def regressed(step_seconds: float, recorded_seconds: float, margin: float) -> bool:
    """Whether a step is more than `margin` (a share) longer than the recorded one."""
    return step_seconds > recorded_seconds * (1 + margin)


def settle(model: str, label: str, cluster: str, alias: str, previous: Champion | None,
           measured: list[Measured], margin: float) -> Standing:
    """The champion after this run's `measured` strategies, by the module's rule."""
    eligible = sorted((entry for entry in measured if entry.ineligible is None),
                      key=lambda entry: entry.step_seconds)
    fields = {"model": model, "label": label, "cluster": cluster, "alias": alias,
              "margin": margin, "previous": previous}
    if previous is None:
        crowned = eligible[0] if eligible else None
        return Standing(**fields, champion=_champion(crowned), challenger=crowned,
                        reference_seconds=None)
    defending = next((entry for entry in measured if entry.strategy == previous.strategy), None)
    reference = previous.step_seconds if defending is None else defending.step_seconds
    challenger = next((entry for entry in eligible if entry.strategy != previous.strategy), None)
    moves = challenger is not None and beats(challenger.step_seconds, reference, margin)
    return Standing(**fields, champion=_champion(challenger) if moves else previous,
                    challenger=challenger, reference_seconds=reference,
                    reference_recorded=defending is None,
                    regression=_regression(model, label, cluster, previous, defending, margin))


def _champion(entry: Measured | None) -> Champion | None:
    return None if entry is None else Champion(version=entry.version, strategy=entry.strategy,
                                               step_seconds=entry.step_seconds)


def _regression(model: str, label: str, cluster: str, previous: Champion,
                defending: Measured | None, margin: float) -> str | None:
    """One line when the champion's strategy ran more than `margin` slower than recorded, in
    the faster quarter of its steps."""
    if defending is None:
        return None
    fast = defending.first_quartile_seconds or defending.step_seconds
    if not regressed(fast, previous.step_seconds, margin):
        return None
    slower = defending.step_seconds / previous.step_seconds - 1
    quartile = ("" if defending.first_quartile_seconds is None
                else f" (first quartile {_ms(fast)})")
    return (f"champion regression: {model} {label} on {cluster}: '{previous.strategy}' ran "
            f"{_ms(defending.step_seconds)} per step{quartile}, {slower:.1%} slower than the "
            f"{_ms(previous.step_seconds)} its champion version {previous.version} recorded "
            f"(margin {_share(margin)})")


def standing_line(standing: Standing) -> str:
    """The verdict in words, for the summary."""
    return f"{standing.where}, alias {standing.alias}: {_verdict_text(standing)}"


def _verdict_text(standing: Standing) -> str:
    champion, previous, challenger = standing.champion, standing.previous, standing.challenger
    if champion is None:
        return "no eligible strategy ran, so there is no champion yet."
    if previous is None:
        return (f"'{champion.strategy}' (registry version {champion.version}, "
                f"{_ms(champion.step_seconds)} per step) crowned, the first champion.")
    if standing.moved:
        return (f"'{champion.strategy}' (registry version {champion.version}) took it from "
                f"'{previous.strategy}' (version {previous.version}): {_against(standing)}.")
    kept = f"'{previous.strategy}' (registry version {previous.version}) stays champion"
    if challenger is None:
        return kept + ": no eligible challenger ran."
    return kept + f": best challenger '{challenger.strategy}' {_against(standing)}."


def _against(standing: Standing) -> str:
    """The challenger's step against the champion's, and which step that was."""
    challenger, reference = standing.challenger, standing.reference_seconds
    assert challenger is not None and reference is not None and standing.previous is not None
    change = 1 - challenger.step_seconds / reference
    holder = standing.previous.strategy
    which = (f"the {_ms(reference)} '{holder}' recorded as champion, as it did not run in this "
             "run" if standing.reference_recorded
             else f"'{holder}' at {_ms(reference)} measured in the same run")
    verdict = (f"{change:.1%} faster" if change >= 0 else f"{-change:.1%} slower")
    return (f"{_ms(challenger.step_seconds)} per step, {verdict} than {which} "
            f"(margin {_share(standing.margin)})")


def version_description(entry: Measured, standing: Standing, source: str) -> str:
    """What a registered version's page says: strategy, measured step and speed-up, where it
    was measured, its standing, and the commit and benchmark run (`source`) it came from."""
    speedup = ("no data parallelism run to compare with" if entry.speedup is None
               else f"{entry.speedup:.2f}x data parallelism measured in the same run")
    return (f"Strategy '{entry.strategy}' of {standing.model}, model version label "
            f"{standing.label}, on cluster {standing.cluster}: {_ms(entry.step_seconds)} per "
            f"step measured (median after the warm-up), {speedup}. "
            f"{_verdict(entry, standing)} {source}.")


def _verdict(entry: Measured, standing: Standing) -> str:
    """This version's place against the champion alias after the run."""
    if entry.ineligible is not None:
        return f"Never champion: {entry.ineligible}."
    champion = standing.champion
    assert champion is not None  # an eligible strategy ran: there is a champion
    if champion.version == entry.version:
        return f"Champion ({standing.alias}): {_verdict_text(standing)}"
    against = ("" if standing.challenger != entry or standing.previous is None
               else f"; {_against(standing)}")
    return (f"Not champion: '{champion.strategy}' (registry version {champion.version}) "
            f"holds {standing.alias}{against}.")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _share(margin: float) -> str:
    """A margin as the config states it, in percent: 0.05 is 5%, 0.025 is 2.5%."""
    return f"{margin * 100:g}%"
