"""A client's flood of tokens naming made-up keys (kids): the JWKS fetches it makes, a
bystander's requests meanwhile, and a key the provider publishes right after (a rotation):
is its first token refused 401 (its client throws it away) or told to retry?

    PYTHONPATH=src python -m bench.jwks_flood
"""

from __future__ import annotations

import statistics
import time
import uuid

import anyio
import httpx
from tests.support import running_gateway
from tests.test_jwks import PING, jwt_config, provider

ACCEPT = "application/json, text/event-stream"


async def main() -> None:
    async with provider("good") as idp, running_gateway(jwt_config(idp)) as gw:
        good = idp.token("good", sub="bystander")
        made_up = [idp.token(f"kid-{uuid.uuid4().hex}", sub="attacker") for _ in range(50)]
        fetched = idp.fetches
        answers: dict[int, int] = {}
        waits: list[float] = []
        done = anyio.Event()

        async def one(http: httpx.AsyncClient, token: str) -> None:
            answer = await http.post(gw.url, json=PING, headers={"Authorization": f"Bearer {token}"})
            answers[answer.status_code] = answers.get(answer.status_code, 0) + 1

        async def attacker() -> None:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as http:
                while not done.is_set():
                    async with anyio.create_task_group() as tg:
                        for n in range(32):
                            tg.start_soon(one, http, made_up[n % len(made_up)])

        async def bystander() -> None:
            headers = {"Authorization": f"Bearer {good}", "Accept": ACCEPT}
            async with httpx.AsyncClient() as http:
                for _ in range(100):
                    started = time.perf_counter()
                    assert (await http.post(gw.url, json=PING, headers=headers)).status_code != 401
                    waits.append(time.perf_counter() - started)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(attacker)
            tg.start_soon(bystander)
        p50, worst = statistics.median(waits) * 1000, max(waits) * 1000
        print(f"attacker's answers {answers}; JWKS fetches during the flood: {idp.fetches - fetched}")
        print(f"bystander's 100 requests: p50 {p50:.1f} ms, max {worst:.1f} ms")
        idp.published.append("new")
        async with httpx.AsyncClient() as http:
            headers = {"Authorization": f"Bearer {idp.token('new', sub='rotated')}"}
            answer = await http.post(gw.url, json=PING, headers=headers)
        print(
            f"a rotated key's first token: {answer.status_code}, Retry-After {answer.headers.get('retry-after')}"
        )


if __name__ == "__main__":
    anyio.run(main)
