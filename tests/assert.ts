// std-style assertions over node:assert/strict (jsr:@std/assert is not reachable here).
import nodeAssert from "node:assert/strict";

/** Assert a value is truthy. */
export function assert(value: unknown, message?: string): asserts value {
  nodeAssert.ok(value, message);
}

/** Deep, strict equality. */
export function assertEquals<T>(
  actual: unknown,
  expected: T,
  message?: string,
): asserts actual is T {
  nodeAssert.deepStrictEqual(actual, expected, message);
}

/** The string matches the pattern. */
export function assertMatch(actual: string, pattern: RegExp, message?: string): void {
  nodeAssert.match(actual, pattern, message);
}

type ErrorCheck<E> = (new (...args: never[]) => E) | ((error: E) => boolean);

function checkError<E>(error: unknown, expected?: ErrorCheck<E>): E {
  if (expected === undefined) return error as E;
  if (expected.prototype instanceof Error || (expected as unknown) === Error) {
    nodeAssert.ok(
      error instanceof (expected as new (...args: never[]) => E),
      `expected ${(expected as { name: string }).name}, got ${String(error)}`,
    );
  } else {
    nodeAssert.ok((expected as (error: E) => boolean)(error as E), `unexpected error: ${error}`);
  }
  return error as E;
}

/** The function throws (optionally an instance of a class or passing a predicate); returns the error. */
export function assertThrows<E = Error>(fn: () => unknown, expected?: ErrorCheck<E>): E {
  try {
    fn();
  } catch (error) {
    return checkError(error, expected);
  }
  throw new nodeAssert.AssertionError({ message: "expected the function to throw" });
}

/** The promise rejects (optionally checked like assertThrows); returns the error. */
export async function assertRejects<E = Error>(
  fn: () => PromiseLike<unknown>,
  expected?: ErrorCheck<E>,
): Promise<E> {
  try {
    await fn();
  } catch (error) {
    return checkError(error, expected);
  }
  throw new nodeAssert.AssertionError({ message: "expected the promise to reject" });
}
