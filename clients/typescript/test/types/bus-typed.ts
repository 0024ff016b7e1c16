// Compiled (never run) by test/types.test.mjs: every line marked @ts-expect-error must fail to
// compile, and the rest must compile, so that the typed bus catches a misspelled field.
import type { Client } from "../../dist/index.js";
import { defineMessage, loadSettings, Receiver, Sender, type Handler } from "../../dist/bus/index.js";

interface OrderPlaced {
  order_id: number;
  customer: string;
  total: number;
}

const OrderPlaced = defineMessage<OrderPlaced>({
  name: "OrderPlaced",
  key: "order_id",
  fields: [["order_id", "int"], ["customer", "string"], { name: "total", type: "float" }],
});

defineMessage<OrderPlaced>({
  name: "OrderPlaced",
  // @ts-expect-error: the key names no field of OrderPlaced
  key: "orderId",
  fields: [["order_id", "int"]],
});

defineMessage<OrderPlaced>({
  name: "OrderPlaced",
  key: "order_id",
  // @ts-expect-error: a misspelled field name
  fields: [["order_id", "int"], ["custmer", "string"]],
});

// @ts-expect-error: not a field type of the bus
defineMessage<OrderPlaced>({ name: "OrderPlaced", key: "order_id", fields: [["order_id", "integer"]] });

// Untyped messages take any field names.
const Loose = defineMessage({ name: "Loose", key: "anything", fields: [["anything", "string"]] });

export async function sends(client: Client): Promise<void> {
  const sender = await Sender.create(client, loadSettings({ identity: "checkout" }));
  await sender.send(OrderPlaced, { order_id: 1, customer: "ada", total: 2.5 });
  // @ts-expect-error: a misspelled field in a message sent
  await sender.send(OrderPlaced, { order_id: 1, custmer: "ada", total: 2.5 });
  // @ts-expect-error: a field of the wrong type
  await sender.send(OrderPlaced, { order_id: "1", customer: "ada", total: 2.5 });
  // @ts-expect-error: a missing field
  await sender.send(OrderPlaced, { order_id: 1, total: 2.5 });
  await sender.send(Loose, { anything: "x" });

  const handler: Handler<OrderPlaced> = {
    messageType: OrderPlaced,
    handle(order) {
      const name: string = order.customer;
      // @ts-expect-error: a misspelled field read in a handler
      const wrong: string = order.custmer;
      return [name, wrong];
    },
  };
  new Receiver(client, loadSettings({ identity: "billing" }), [handler], { concurrency: 2, ordered: true, retry: { maxAttempts: 3 } });
}
