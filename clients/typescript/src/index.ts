export * from "./codec.js";
export * from "./limits.js";
export { Reader, Writer, toU64 } from "./wire.js";
