/**
 * The session settings the worker's own statements need, where the database's defaults differ
 * (`ALTER DATABASE … SET` or `ALTER ROLE … SET`, which teams set for their own code):
 *
 * - read committed isolation: claims skip each other's locked rows with `FOR UPDATE SKIP
 *   LOCKED`, and the count of a limit key's running jobs after its row is locked must see
 *   what has committed; at `serializable` concurrent claims and outcome writes fail against
 *   each other and are retried after a pause;
 * - at least 15 significant digits in `float8` output (`extra_float_digits` 0 or more): the
 *   claim and the schedules read times as epoch numbers, which fewer digits round to
 *   another day;
 * - ISO dates: postgres.js reads timestamps only in the ISO style (`DateStyle` `SQL, DMY`
 *   swaps day and month).
 *
 * The worker reads them at its first heartbeat and reopens its loop's connection with the
 * missing ones as startup parameters (loop_connection.ts), before its first claim.
 *
 * @module
 */

/** A session's settings, as a heartbeat reads them. */
export interface SessionReport {
  /** `transaction_isolation` of the beat's own transaction. */
  isolation: string;
  /** `DateStyle`, e.g. `ISO, MDY`. */
  dateStyle: string;
  /** `extra_float_digits`, -15 to 3. */
  floatDigits: number;
}

/**
 * The startup parameters that give a session of `report` what the worker needs; empty when
 * it has it already.
 *
 * @example
 * ```ts ignore
 * neededSettings({ isolation: "serializable", dateStyle: "ISO, DMY", floatDigits: 1 });
 * // { default_transaction_isolation: "read committed" }
 * ```
 */
export function neededSettings(report: SessionReport): Record<string, string> {
  const settings: Record<string, string> = {};
  if (report.isolation !== "read committed") {
    settings.default_transaction_isolation = "read committed";
  }
  if (!/^\s*iso\b/i.test(report.dateStyle)) settings.DateStyle = "ISO";
  if (!(report.floatDigits >= 0)) settings.extra_float_digits = "1";
  return settings;
}
