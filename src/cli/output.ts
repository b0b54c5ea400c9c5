/**
 * How the operations commands print: listings as a header line plus one line per row,
 * columns separated by a tab (`cut -f` and `awk -F'\t'` friendly), `-` for an empty
 * value, times as ISO 8601 in UTC; records (`jobs show`) as `key: value` lines; `--json`
 * as one JSON document with stable keys and ISO 8601 times.
 *
 * @module
 */

/** One column of a listing: its header and how to read a row's cell. */
export interface Column<T> {
  /** Header text (upper case, no spaces). */
  header: string;
  /** The cell of a row (formatted with {@linkcode formatCell}). */
  value: (row: T) => unknown;
}

// deno-lint-ignore no-control-regex -- matching them is the point
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;

/**
 * A text made safe to print to a terminal: every control character (C0, DEL, C1) is
 * shown as a `\xNN` escape, so text from the database (task names, keys, error messages)
 * cannot move the cursor, retitle the window or recolour the output with an escape
 * sequence. Every text printer of the CLI goes through it; `--json` needs no help.
 */
export function safeText(text: string): string {
  return text.replace(CONTROL, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}

/**
 * A value as JSON whose strings hold no raw DEL or C1 character (JSON.stringify escapes
 * the C0 ones only): `\u00NN` escapes, the same JSON value.
 */
export function safeJson(value: unknown, indent?: number): string {
  return JSON.stringify(value, null, indent).replace(
    /[\u007f-\u009f]/g,
    (c) => `\\u00${c.charCodeAt(0).toString(16)}`,
  );
}

/**
 * One cell as text: `-` for null/undefined/empty, ISO 8601 (UTC) for dates, comma-joined
 * arrays, compact JSON for objects; tabs and line breaks become spaces so a row stays one
 * line, other control characters `\xNN` escapes ({@linkcode safeText}).
 */
export function formatCell(value: unknown): string {
  let text: string;
  if (value === null || value === undefined) text = "";
  else if (value instanceof Date) text = isoTime(value) ?? "";
  else if (Array.isArray(value)) text = value.map(formatCell).join(",");
  else if (typeof value === "object") text = safeJson(value);
  else text = String(value);
  text = safeText(text.replace(/[\t\r\n]+/g, " "));
  return text === "" ? "-" : text;
}

/** A listing: the header line, then one tab-separated line per row. */
export function formatTable<T>(columns: readonly Column<T>[], rows: readonly T[]): string[] {
  const lines = [columns.map((c) => c.header).join("\t")];
  for (const row of rows) lines.push(columns.map((c) => formatCell(c.value(row))).join("\t"));
  return lines;
}

/** Print a listing (see {@linkcode formatTable}). */
export function printTable<T>(columns: readonly Column<T>[], rows: readonly T[]): void {
  for (const line of formatTable(columns, rows)) console.log(line);
}

/** Print `key: value` lines, skipping entries whose value is `undefined`. */
export function printRecord(entries: readonly [string, unknown][]): void {
  for (const [key, value] of entries) {
    if (value !== undefined) console.log(`${key}: ${formatCell(value)}`);
  }
}

/** Print a value as indented JSON (dates as ISO 8601 strings). */
export function printJson(value: unknown): void {
  console.log(safeJson(value, 2));
}

/** A date as ISO 8601 in UTC, or null. */
export function isoTime(value: Date | null | undefined): string | null {
  if (value === null || value === undefined) return null;
  const date = value instanceof Date ? value : new Date(value);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

/** Milliseconds as seconds (null stays null). */
export function msToSeconds(ms: number | null | undefined): number | null {
  return ms === null || ms === undefined ? null : ms / 1000;
}
