"""``flyexplore env``: the environment report and FlyDSL readiness (:mod:`flyexplore.world.env`)."""
from __future__ import annotations

import argparse
import json

HELP = "environment report and FlyDSL readiness"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.world.env import collect

    env = collect()
    print(json.dumps(env.to_dict(), indent=2, default=str) if a.json else env.to_text())
    return 0
