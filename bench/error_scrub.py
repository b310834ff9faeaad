"""What taking an upstream's credential out of its error results costs (``translation.unquoted``),
against what the gateway spends anyway to write that result to its client (its JSON dump).

    .venv/bin/python bench/error_scrub.py
"""

from __future__ import annotations

import timeit

import mcp_types as types

from agent_gateway.upstreams.translation import unquoted

SECRETS = ("sk-upstream-0123456789abcdef", "another-configured-word")


def _results(size: int) -> tuple[types.CallToolResult, types.CallToolResult]:
    """An error result of ``size`` characters quoting nothing, and one quoting the credential
    in its text and its ``structuredContent`` (``size`` characters each)."""
    quoting = "x" * (size - 40) + f" Bearer {SECRETS[0]}"
    clean = types.CallToolResult(content=[types.TextContent(text="y" * size)], is_error=True)
    quoted = types.CallToolResult(
        content=[types.TextContent(text=quoting)], structured_content={"error": quoting}, is_error=True
    )
    return clean, quoted


def _per_call(run: object, number: int) -> float:
    return timeit.timeit(run, number=number) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    print("command: .venv/bin/python bench/error_scrub.py")
    print("| error result | quoting nothing | its dump | ratio | quoting the credential | its dump | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for size in (200, 64_000, 8_000_000):
        clean, quoted = _results(size)
        number = 2_000 if size < 100_000 else 5
        rows = []
        for result in (clean, quoted):
            scrub = _per_call(lambda r=result: unquoted(r, SECRETS), number)
            dump = _per_call(lambda r=result: r.model_dump_json(by_alias=True, exclude_none=True), number)
            rows.append(f"{scrub:,.1f} us | {dump:,.1f} us | {scrub / dump:.2f}")
        print(f"| {size:,} characters | {' | '.join(rows)} |")


if __name__ == "__main__":
    main()
