"""Publishes to a FerryMQ cluster and reads the messages back.

    FERRYMQ_ADDR=10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070 python examples/cluster.py
"""

import asyncio
import uuid

import ferrymq


async def main() -> None:
    # The seeds: a list, or FERRYMQ_ADDR with commas when none is given.
    async with ferrymq.Client() as client:
        info = await client.cluster_info()
        print("nodes:", {n.id: n.addr for n in info.nodes}, "metadata leader:", info.metadata_leader)
        # Goes to the metadata leader; replicas defaults to 3 in a cluster of three nodes.
        await client.create_topic("orders", partitions=2, if_not_exists=True)
        sub = await client.subscribe("orders", "billing", start="earliest")  # on every node
        for i in range(10):
            # Goes to the partition's leader; with a dedup id it is sent again, stored once,
            # when the leader fails before its receipt.
            receipt = await client.publish("orders", f"order {i}".encode(), key=f"customer-{i}", dedup_id=uuid.uuid4().hex)
            print("stored as", receipt.id)
        received = 0
        async for message in sub:
            async with message:  # acked on the node that delivered it
                print("received", message.id, message.body.decode())
            received += 1
            if received == 10:
                break
        await sub.close()


asyncio.run(main())
