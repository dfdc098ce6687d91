"""``flyexplore switches``: the state of every FlyDSL switch (:mod:`flyexplore.world.switches`)."""
from __future__ import annotations

import argparse
import json

HELP = "the state of every FlyDSL switch"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.world import switches

    if a.json:
        print(json.dumps(switches.table().to_dict(orient="records"), indent=2, default=str))
    else:
        print(switches.text())
    return 0
