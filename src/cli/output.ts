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

/**
 * One cell as text: `-` for null/undefined/empty, ISO 8601 (UTC) for dates, comma-joined
 * arrays, compact JSON for objects; tabs and line breaks become spaces so a row stays one
 * line.
 */
export function formatCell(value: unknown): string {
  let text: string;
  if (value === null || value === undefined) text = "";
  else if (value instanceof Date) text = isoTime(value) ?? "";
  else if (Array.isArray(value)) text = value.map(formatCell).join(",");
  else if (typeof value === "object") text = JSON.stringify(value);
  else text = String(value);
  text = text.replace(/[\t\r\n]+/g, " ");
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
  console.log(JSON.stringify(value, null, 2));
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
