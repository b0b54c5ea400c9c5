// Command-line flags of the bench scripts that take `--name value` pairs.

/** The value after `name` in `args`, or `fallback` when the flag is absent. */
export function flagValue(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(name);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}
