/**
 * Where the admin functions read and write: their options, the read target (the app or a
 * postgres.js instance) and the write session (a pool or the caller's transaction).
 *
 * @module
 */
import { quoteSchema, type Sql, type TransactionSql } from "../db.ts";

/** Options of the admin functions. */
export interface AdminOptions {
  /** The schema of akadze's tables. Default `"akadze"` (or the app's, when given the app). */
  schema?: string;
}

/** Where reads go: the app (its pool and schema) or a postgres.js instance. */
export type Database = Sql | { readonly sql: Sql; readonly schema: string };

/** A write session: a postgres.js instance or a transaction of one. */
export type Session = Sql | TransactionSql;

/** The pool, the quoted schema and the schema name of a read. */
export function readTarget(db: Database, options: AdminOptions): [Sql, string, string] {
  const schema = options.schema ?? (typeof db === "function" ? "akadze" : db.schema);
  return [typeof db === "function" ? db : db.sql, quoteSchema(schema), schema];
}
