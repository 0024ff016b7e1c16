// The root of every error the package raises; a file of its own so that the codec can extend it
// without importing the client.

/** Every error the client raises, with a stable `code` to branch on. */
export class FerryMQError extends Error {
  readonly code: string;

  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "FerryMQError";
    this.code = code;
  }
}
