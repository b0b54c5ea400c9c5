/**
 * What JSON (and PostgreSQL's jsonb) can carry faithfully. Used to refuse task arguments
 * at enqueue and to recognise results that cannot be stored.
 *
 * @module
 */

const MAX_DEPTH = 200;

/**
 * Describe why a value cannot round-trip through jsonb, or return null when it can.
 * Refused: BigInt, NaN and ±Infinity, functions, symbols, `undefined` values, cycles,
 * sparse arrays, non-plain objects (Date, Map, class instances...), and strings or keys
 * containing NUL or a lone surrogate.
 */
export function jsonProblem(value: unknown, root = "value"): string | null {
  // Paths are built only for the value that has a problem: the walk itself allocates
  // nothing per value (it runs on every enqueued argument and every result).
  const ancestors: object[] = [];
  const steps: string[] = [];
  const visit = (v: unknown, depth: number): Problem | null => {
    switch (typeof v) {
      case "string":
        return stringProblem(v);
      case "boolean":
        return null;
      case "number":
        return Number.isFinite(v) ? null : (path) => `${path} is ${v}, which JSON cannot carry`;
      case "undefined":
        return (path) => `${path} is undefined (use null or leave the key out)`;
      case "bigint":
        return (path) => `${path} is a BigInt (convert it to a string or number)`;
      case "function":
      case "symbol":
        return (path) => `${path} is a ${typeof v}`;
    }
    if (v === null) return null;
    if (depth > MAX_DEPTH) return (path) => `${path} is nested more than ${MAX_DEPTH} levels deep`;
    const obj = v as object;
    if (ancestors.includes(obj)) return (path) => `${path} is a circular reference`;
    ancestors.push(obj);
    try {
      if (Array.isArray(obj)) {
        for (let i = 0; i < obj.length; i++) {
          if (!(i in obj)) {
            steps.push(`[${i}]`);
            return (path) => `${path} is a hole in a sparse array`;
          }
          const problem = visit(obj[i], depth + 1);
          if (problem) {
            steps.push(`[${i}]`);
            return problem;
          }
        }
        return null;
      }
      const proto = Object.getPrototypeOf(obj);
      if (proto !== Object.prototype && proto !== null) {
        const kind = (obj as { constructor?: { name?: string } }).constructor?.name ?? "object";
        return (path) =>
          `${path} is a ${kind}, not a plain object (convert it, e.g. a Date to an ISO string)`;
      }
      if (Object.getOwnPropertySymbols(obj).length) return (path) => `${path} has symbol keys`;
      for (const key in obj) {
        if (!Object.hasOwn(obj, key)) continue;
        const keyProblem = stringProblem(key);
        if (keyProblem) return (path) => keyProblem(`a key of ${path}`);
        const problem = visit((obj as Record<string, unknown>)[key], depth + 1);
        if (problem) {
          steps.push(/^[A-Za-z_$][\w$]*$/.test(key) ? `.${key}` : `[${JSON.stringify(key)}]`);
          return problem;
        }
      }
      return null;
    } finally {
      ancestors.pop();
    }
  };
  const problem = visit(value, 0);
  return problem ? problem(root + steps.reverse().join("")) : null;
}

/** A problem found at some path, described once the path is known. */
type Problem = (path: string) => string;

function stringProblem(s: string): Problem | null {
  if (s.includes("\u0000")) {
    return (path) => `${path} contains a NUL character, which PostgreSQL cannot store`;
  }
  // A lone surrogate has no UTF-8 form; PostgreSQL refuses it.
  if (/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s)) {
    return (path) => `${path} contains a lone UTF-16 surrogate`;
  }
  return null;
}

/**
 * Whether `a` is the same JSON value as `b`: equal primitives, arrays of the same elements,
 * plain objects with the same own keys and values in any order. The walk follows `b`'s
 * structure, so `b` must be finite and acyclic (a value `jsonProblem` accepts); `a` may be
 * anything.
 */
export function sameJson(a: unknown, b: unknown, depth = 0): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (depth > MAX_DEPTH) return false;
  if (Array.isArray(b)) {
    if (!Array.isArray(a) || a.length !== b.length) return false;
    for (let i = 0; i < b.length; i++) {
      if (!(i in a) || !sameJson(a[i], b[i], depth + 1)) return false;
    }
    return true;
  }
  if (Array.isArray(a) || !isPlainObject(a) || !isPlainObject(b)) return false;
  const keys = Object.keys(b);
  if (Object.keys(a).length !== keys.length) return false;
  for (const key of keys) {
    if (!Object.hasOwn(a, key)) return false;
    const x = (a as Record<string, unknown>)[key], y = (b as Record<string, unknown>)[key];
    if (!sameJson(x, y, depth + 1)) return false;
  }
  return true;
}

/** Whether a value is a plain object (not null, not an array, Object or null prototype). */
export function isPlainObject(value: unknown): boolean {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}
