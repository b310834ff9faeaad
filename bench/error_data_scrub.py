"""What taking an upstream's credential out of its JSON-RPC error's ``data`` costs
(``translation.scrubbed_json``), against scrubbing its JSON text alone (the code before, which
failed where the credential was quoted as a number) and walking it one string at a time.

    .venv/bin/python bench/error_data_scrub.py
"""

from __future__ import annotations

import contextlib
import json
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

from agent_gateway.logs import scrubbed
from agent_gateway.upstreams.translation import _scrubber, scrubbed_json, scrubbed_value  # pyright: ignore[reportPrivateUsage]

SECRETS = ("sk-upstream-0123456789abcdef", "another-secret-value-xyz", "123456789012")
DATA: dict[str, Any] = {
    "5,000 short strings": ["ab"] * 5000,
    "one 60 KB string": {"why": "x" * 60_000},
    "one 60 KB string quoting it": {"why": "x" * 60_000 + SECRETS[0]},
    "5,000 strings, one quoting it": ["sk-abcde"] * 5000 + [SECRETS[0]],
    "4,000 numbers, one quoting it as a number": {**{f"k{i}": i for i in range(4000)}, "a": 123456789012},
}


def _ms(run: Callable[[], object]) -> str:
    def guarded() -> None:
        with contextlib.suppress(ValueError):  # the text left unparsable: the client's internal error
            run()

    return f"{timeit.timeit(guarded, number=20) / 20 * 1e3:.2f} ms"


def main() -> None:
    print("command: .venv/bin/python bench/error_data_scrub.py")
    print("| an error's data | as text (before) | walked, one string at a time | scrubbed_json |")
    print("|---|---:|---:|---:|")
    for shape, data in DATA.items():
        text = _ms(lambda d=data: json.loads(scrubbed(json.dumps(d), SECRETS)))
        walked = _ms(lambda d=data: scrubbed_value(d, partial(scrubbed, secrets=SECRETS)))
        now = _ms(lambda d=data: scrubbed_json(d, partial(scrubbed, secrets=SECRETS), _scrubber(SECRETS)))
        print(f"| {shape} | {text} | {walked} | {now} |")


if __name__ == "__main__":
    main()
