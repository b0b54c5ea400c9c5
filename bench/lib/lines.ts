// Reading a child process's output line by line.

/** Reads text lines from a byte stream; `next()` resolves to null at the end. */
export class LineReader {
  #reader: ReadableStreamDefaultReader<string>;
  #buffer = "";
  #done = false;

  constructor(stream: ReadableStream<Uint8Array>) {
    this.#reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  }

  async next(): Promise<string | null> {
    for (;;) {
      const nl = this.#buffer.indexOf("\n");
      if (nl >= 0) {
        const line = this.#buffer.slice(0, nl);
        this.#buffer = this.#buffer.slice(nl + 1);
        return line;
      }
      if (this.#done) {
        if (!this.#buffer) return null;
        const rest = this.#buffer;
        this.#buffer = "";
        return rest;
      }
      const { value, done } = await this.#reader.read();
      if (done) this.#done = true;
      else this.#buffer += value;
    }
  }

  /** Release the stream (pending reads end). */
  async cancel(): Promise<void> {
    await this.#reader.cancel().catch(() => {});
  }
}

/** Text written to a child's stdin, one line per call. */
export class LineWriter {
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #encoder = new TextEncoder();

  constructor(stream: WritableStream<Uint8Array>) {
    this.#writer = stream.getWriter();
  }

  async write(line: string): Promise<void> {
    await this.#writer.write(this.#encoder.encode(`${line}\n`));
  }

  async close(): Promise<void> {
    await this.#writer.close().catch(() => {});
  }
}
