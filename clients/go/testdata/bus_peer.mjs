// The TypeScript side of the Go client's cross-language bus test: sends or receives OrderPlaced
// messages with the TypeScript bus and prints each as a `PEER {json}` line.
//
//     node bus_peer.mjs <clients/typescript/dist> probe|send|receive ADDR COUNT SHARDS
import { pathToFileURL } from "node:url";
import { join, resolve } from "node:path";

const [dist, role, addr, countArg, shardsArg] = process.argv.slice(2);
const count = Number(countArg), shards = Number(shardsArg);
const { Client } = await import(pathToFileURL(resolve(join(dist, "index.js"))).href);
const { defineMessage, loadSettings, Receiver, Sender, Serializers } = await import(pathToFileURL(resolve(join(dist, "bus", "index.js"))).href);

const OrderPlaced = defineMessage({
  name: "OrderPlaced",
  key: "order_id",
  fields: [["order_id", "int"], ["customer", "string"], ["total", "float"], ["express", "bool"]],
});
const serializers = await Serializers.load();
const unavailable = serializers.unavailable();
const names = serializers.names().filter((n) => !unavailable.has(n));
console.log("SERIALIZERS " + names.join(","));
if (role !== "probe") {
  const client = await Client.connect({ url: addr, reconnect: false });
  try {
    if (role === "send") {
      for (let i = 0; i < count; i++) {
        const ser = names[i % names.length];
        const sender = await Sender.create(client, loadSettings({ identity: "ts-checkout", shardCount: shards, serializer: ser }, [], {}));
        const o = { order_id: i * 15485863 - 70, customer: `typescript \u2713 "${i}"\n`, total: i / 16, express: i % 4 === 0 };
        await sender.send(OrderPlaced, o);
        console.log("PEER " + JSON.stringify({ ...o, serializer: ser }));
      }
    } else {
      const seen = [];
      const receiver = new Receiver(client, loadSettings({ identity: "ts-billing", shardCount: shards }, [], {}), [
        { messageType: OrderPlaced, handle: (m, c) => void seen.push([m, c]) },
      ]);
      await receiver.start();
      const end = Date.now() + 30_000;
      while (seen.length < count && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      await receiver.stop();
      for (const [m, c] of seen) {
        console.log("PEER " + JSON.stringify({ order_id: Number(m.order_id), customer: m.customer, total: m.total, express: m.express,
          serializer: c.serializer, sender: c.sender, shard: c.shard, partition: c.delivery.partition }));
      }
    }
  } finally {
    await client.close();
  }
}
