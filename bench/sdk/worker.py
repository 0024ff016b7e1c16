"""A bus worker for bench/sdk/targets.py: receives Job messages from TOPIC under IDENTITY with
CONCURRENCY handlers and PREFETCH, each taking WORK_MS, until SIGTERM drains it. Writes one
`id attempt` line per handled message to OUT and a JSON summary line to stdout.

    python3 worker.py ADDR TOPIC IDENTITY CONCURRENCY PREFETCH WORK_MS OUT
"""

import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass

import ferrymq
from ferrymq import bus


@bus.message(key="customer", name="Job")
@dataclass
class Job:
    id: int
    customer: str
    pad: str


async def main() -> None:
    addr, topic, identity, concurrency, prefetch, work_ms, out = sys.argv[1:8]
    work = int(work_ms) / 1000
    seen: list[str] = []
    times = [0.0, 0.0]

    class Worker(bus.Handler[Job]):
        message_type = Job

        async def handle(self, job: Job, context: bus.Context) -> None:
            if work:
                await asyncio.sleep(work)
            now = time.perf_counter()
            if not seen:
                times[0] = now
            times[1] = now
            seen.append(f"{job.id} {context.attempt}")

    async with ferrymq.Client(addr) as client:
        settings = bus.Settings(addr=addr, identity=identity, topic_template=topic)
        receiver = bus.Receiver(client, settings, [Worker()], concurrency=int(concurrency), prefetch=int(prefetch), create_topics=False)
        stop = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
        await receiver.start()
        print("READY", flush=True)
        await stop
        released = await receiver.drain()
    with open(out, "w") as f:
        f.write("\n".join(seen) + ("\n" if seen else ""))
    span = times[1] - times[0]
    print(json.dumps({"handled": len(seen), "released": released, "seconds": span, "rate": (len(seen) - 1) / span if span > 0 else 0}), flush=True)


asyncio.run(main())
