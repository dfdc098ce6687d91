"""The environments of an A/B, picked in a notebook: :class:`EnvPicker`.

UI only: every check is :mod:`flyexplore.run.envs`' (:func:`~flyexplore.run.envs.parse_env` as you
type, :func:`~flyexplore.run.envs.probe` on "Check"), and what the picker holds goes to
``fx.sweep(..., **picker.options)`` (:class:`flyexplore.run.spec.SweepSpec`'s ``envs``, ``aa``,
``pairs``). Needs ipywidgets (the ``notebook`` extra).
"""
from __future__ import annotations

import ipywidgets as W

from flyexplore.errors import UsageError
from flyexplore.run.envs import PAIRS, check_envs, probe
from flyexplore.ui.widget_base import Sync, html_span


class EnvPicker:
    """Pick an environment A/B's environments: one per line in :attr:`text` -- ``NAME`` (this
    interpreter), ``NAME=/path/to/python`` (a conda env or venv), ``NAME:VAR=VALUE,...`` (variables
    set at the worker's start) -- with :attr:`aa` (the first environment against a copy of itself)
    and :attr:`pairs` (fresh pairs of workers: ``auto``, the default -- :data:`flyexplore.run.envs.PAIRS`,
    then more while a label is AMBIGUOUS -- or a number).

    Each change is checked at once (names, variables: :func:`flyexplore.run.envs.parse_env`); the
    "Check" button (:meth:`check`) also starts each interpreter to see that it finds torch, numpy and
    flyexplore (:func:`flyexplore.run.envs.probe`). :attr:`status` shows the outcome, one line per
    environment. :attr:`options` is what ``fx.sweep`` takes (``envs``, ``aa``, ``pairs``); it raises
    :class:`~flyexplore.errors.UsageError` while the text is not valid. Display it by making it the
    last expression of a cell (:attr:`widget`)."""

    def __init__(self, envs=("base",), *, aa: bool = False, pairs: int | str | None = None):
        self._sync = Sync()
        self.text = W.Textarea(value="\n".join(envs), placeholder="base\n0.14.2b=/opt/envs/aot0142/bin/python",
                               description="environments", layout=W.Layout(width="640px", height="90px"),
                               style={"description_width": "initial"})
        self.aa = W.Checkbox(value=aa, description="A/A (the first against a copy of itself)", indent=False)
        self.pairs = W.Combobox(value=str(pairs or "auto"), options=["auto", str(PAIRS), "5", "8"],
                                ensure_option=False, description="pairs", layout=W.Layout(width="160px"),
                                tooltip="auto: 3 pairs, then one more at a time while a label is AMBIGUOUS "
                                        "(up to 10); or a number of pairs")
        self.pairs.observe(lambda _ch: self._parse(), names="value")
        self.check_button = W.Button(description="Check", icon="check",
                                     tooltip="start each interpreter: does it find torch, numpy and flyexplore?")
        self.status = W.HTML()
        for w in (self.text, self.aa):
            w.observe(lambda _ch: self._parse(), names="value")
        self.check_button.on_click(lambda _b: self.check())
        self.widget = W.VBox([self.text, W.HBox([self.aa, self.pairs, self.check_button]), self.status])
        self._parse()

    def lines(self) -> list[str]:
        """The environments as typed, one per non-empty line."""
        return [ln.strip() for ln in self.text.value.splitlines() if ln.strip()]

    def _pairs(self) -> int | str:
        """The pairs as ``fx.sweep`` takes them: ``"auto"`` or an integer >= 1. Raises
        :class:`~flyexplore.errors.UsageError` naming another value."""
        v = str(self.pairs.value).strip().lower()
        if v == "auto":
            return "auto"
        if v.isdigit() and int(v) >= 1:
            return int(v)
        raise UsageError(f"pairs must be 'auto' or an integer >= 1, got {self.pairs.value!r}")

    def _parse(self):
        try:
            self._pairs()
            envs = check_envs(self.lines(), self.aa.value)
        except UsageError as exc:
            self.status.value = html_span(str(exc), "error")
            return None
        self.status.value = "<br>".join(html_span(f"{e.name}: {e.interpreter}; changes: {e.changes_text()}", "info")
                                        for e in envs)
        return envs

    def check(self) -> bool:
        """Parse every line and start each interpreter (:func:`flyexplore.run.envs.probe`); the
        outcome goes to :attr:`status`. Returns whether all of them are good."""
        envs = self._parse()
        if envs is None:
            return False
        out, ok = [], True
        for e in envs:
            try:
                got = probe(e)
                out.append(html_span(f"{e.name}: ok -- Python {'.'.join(map(str, got['python']))} at "
                                     f"{got['executable']}, flyexplore {got['flyexplore']}", "ok"))
            except UsageError as exc:
                ok = False
                out.append(html_span(str(exc), "error"))
        self.status.value = "<br>".join(out)
        return ok

    @property
    def options(self) -> dict:
        """``{"envs": [...], "aa": bool, "pairs": "auto" or int}`` for ``fx.sweep`` (the
        environments' text as typed). Raises :class:`~flyexplore.errors.UsageError` when the text
        or the pairs are not valid."""
        check_envs(self.lines(), self.aa.value)
        return {"envs": self.lines(), "aa": bool(self.aa.value), "pairs": self._pairs()}

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
