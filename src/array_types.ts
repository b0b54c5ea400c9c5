/**
 * The array types of every pool akadze makes or adopts, known from the start. postgres.js
 * learns them lazily: each new connection first asks the server for them, and installs them
 * a few promise turns after the answer, while the statement that opened the connection is
 * already on its way. When that statement's own reply is read before those turns (a loaded
 * machine, a statement long enough to be written at once), its JS array parameter is sent
 * as a plain string (`malformed array literal: "default"`) and an array column comes back
 * as text. A pool that never fetches them (`fetch_types: false`) fails the same way every
 * time. The builtin array types have fixed OIDs, so they are installed here, as postgres.js
 * would install them, before any statement runs.
 *
 * @module
 */
/**
 * The array types akadze's own statements use: builtin element type OID → array type OID
 * (fixed in PostgreSQL's pg_type, the same in every version). Others are left to the driver.
 */
const BUILTIN_ARRAYS: ReadonlyArray<readonly [element: number, array: number]> = [
  [16, 1000], // boolean
  [20, 1016], // bigint
  [23, 1007], // integer
  [25, 1009], // text
];

/** The parts of postgres.js's parsed options the array types live in. */
interface TypeOptions {
  serializers: Record<number, (value: unknown) => unknown>;
  parsers: Record<number, (value: string) => unknown>;
  transform?: { undefined?: unknown };
}

/**
 * Install the builtin array types on the pool `sql` (and every connection and transaction
 * derived from it), where the pool does not know them yet. A pool that is not postgres.js's
 * own (a wrapper without its options) is left alone.
 *
 * @example
 * ```ts ignore
 * import postgres from "postgres";
 * import { installArrayTypes } from "./array_types.ts";
 * const sql = postgres(url);
 * installArrayTypes(sql);
 * ```
 */
export function installArrayTypes(sql: object): void {
  const options = (sql as unknown as { options?: Partial<TypeOptions> }).options;
  if (!options || typeof options !== "object") return;
  const { serializers, parsers } = options;
  if (!serializers || typeof serializers !== "object" || !parsers || typeof parsers !== "object") {
    return;
  }
  for (const [element, array] of BUILTIN_ARRAYS) {
    // Already known (fetched, or the user's own): postgres.js keeps the first one too.
    if (serializers[array] && parsers[array]) continue;
    serializers[array] = (value) =>
      serializeArray(value, serializers[element], options as TypeOptions);
    parsers[array] = (text) => parseArray(text, parsers[element]);
  }
}

/**
 * A JS array as a PostgreSQL array literal, every element quoted (`{"a","b",null}`), each
 * serialised as its element type would be; nested arrays make more dimensions. A value
 * that is not an array (a literal already) is sent as it is.
 */
export function serializeArray(
  value: unknown,
  serialize?: (x: unknown) => unknown,
  options: Pick<TypeOptions, "transform"> = {},
): unknown {
  if (!Array.isArray(value)) return value;
  if (value.length === 0) return "{}";
  if (Array.isArray(value[0])) {
    return `{${value.map((x) => serializeArray(x, serialize, options)).join(",")}}`;
  }
  // A loop and one test per element: arrays of thousands of elements (a flow's steps).
  const parts = new Array<string>(value.length);
  for (let i = 0; i < value.length; i++) {
    let x = value[i];
    if (x === undefined) {
      x = options.transform?.undefined;
      if (x === undefined) throw new TypeError("undefined values are not allowed in an array");
    }
    if (x === null) {
      parts[i] = "null";
      continue;
    }
    // postgres.js's typed parameters (sql.typed, sql.json) carry their value.
    const plain = typeof x === "object" && "type" in x && "value" in x
      ? (x as { value: unknown }).value
      : x;
    parts[i] = quote(String(serialize ? serialize(plain) : plain));
  }
  return `{${parts.join(",")}}`;
}

/** A character that a quoted array element escapes. */
const NEEDS_ESCAPE = /["\\]/;

/**
 * A JS array of strings, numbers and nulls as a PostgreSQL array literal of one dimension,
 * of the values {@linkcode serializeArray} writes for it (strings and numbers as their text;
 * null as null). Made for arrays of thousands (a flow's columns): one value repeated is its
 * text repeated, strings without a quote or backslash and numbers are joined at once.
 *
 * @example
 * ```ts ignore
 * arrayLiteral(["a", 'b"c', null]); // '{"a","b\\"c",null}'
 * ```
 */
export function arrayLiteral(values: readonly (string | number | null)[]): string {
  const n = values.length;
  if (n === 0) return "{}";
  const first = values[0];
  let i = 1;
  while (i < n && values[i] === first) i++;
  if (i === n) return repeatedLiteral(first, n);
  const kind = typeof first;
  if (kind === "number" || kind === "string") {
    while (i < n && typeof values[i] === kind) i++;
    if (i === n && kind === "number") return `{${values.join(",")}}`;
    if (i === n && !NEEDS_ESCAPE.test(values.join(","))) return `{"${values.join('","')}"}`;
  }
  let text = "{";
  for (let k = 0; k < n; k++) text += k === 0 ? quote(values[k]) : `,${quote(values[k])}`;
  return `${text}}`;
}

/** An array literal of `n` (at least one) elements, each `value`. */
export function repeatedLiteral(value: string | number | null, n: number): string {
  const element = quote(value);
  return `{${`${element},`.repeat(n - 1)}${element}}`;
}

/** One element of an array literal: null, or the value's text quoted (and escaped). */
function quote(value: string | number | null): string {
  if (value === null) return "null";
  const text = typeof value === "string" ? value : String(value);
  return NEEDS_ESCAPE.test(text)
    ? `"${text.replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`
    : `"${text}"`;
}

/**
 * A PostgreSQL array's text form (`{a,"b c",NULL}`, nested for more dimensions) as a JS
 * array, each element read by `parse` (as text without it); an unquoted NULL is null.
 */
export function parseArray(text: string, parse?: (value: string) => unknown): unknown[] {
  let i = text.indexOf("{");
  if (i < 0) throw new TypeError("not an array literal");
  const element = (raw: string) => parse ? parse(raw) : raw;
  const list = (): unknown[] => {
    const out: unknown[] = [];
    i++; // past "{"
    if (text[i] === "}") {
      i++;
      return out;
    }
    while (i < text.length) {
      if (text[i] === "{") out.push(list());
      else if (text[i] === '"') {
        let s = "";
        i++;
        while (i < text.length && text[i] !== '"') {
          if (text[i] === "\\") i++;
          s += text[i++];
        }
        i++; // past the closing quote
        out.push(element(s));
      } else {
        const start = i;
        while (i < text.length && text[i] !== "," && text[i] !== "}") i++;
        const raw = text.slice(start, i);
        out.push(raw === "NULL" ? null : element(raw));
      }
      if (text[i] === ",") {
        i++;
        continue;
      }
      i++; // past "}"
      return out;
    }
    throw new TypeError("unterminated array literal");
  };
  return list();
}
