// The fenced code blocks of the Markdown docs, for the tests that check (docs_test.ts) and run
// (consumer_docs_test.ts) them.

/** A fenced code block of a Markdown file. */
export interface Block {
  /** The Markdown file, relative to the repository root. */
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  /** The fence's language (`ts`, `sh`, ...), `""` when none. */
  lang: string;
  /** Whether the fence says `ignore` after the language (` ```ts ignore `). */
  ignored: boolean;
  /** The prelude from the `<!-- prelude: ... -->` comment before it, if any (one line). */
  prelude: string;
  /** The file the text before the block (since the previous block) saves it as, if any. */
  saveAs?: string;
  /** The code. */
  code: string;
}

const FENCE = /^(\s*)(`{3,}|~{3,})\s*([\w-]*)([^\n]*)$/;
const PRELUDE = /<!--\s*prelude:([\s\S]*?)-->\s*$/;
/** "Save this as `app.ts`" (or "save it as"), the way the docs name a sample's file. */
const SAVE_AS = /\bsave\s+(?:this|it)\s+as\s+`([\w./-]+)`/gi;

/** Every fenced block of a Markdown text, in order. */
export function extractBlocks(file: string, markdown: string): Block[] {
  const lines = markdown.split("\n");
  const blocks: Block[] = [];
  let previousEnd = 0;
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i]);
    if (!open) continue;
    const [, indent, fence, lang, rest] = open;
    let end = i + 1;
    while (end < lines.length && lines[end].trim() !== fence) end++;
    const body = lines.slice(i + 1, end).map((l) =>
      l.startsWith(indent) ? l.slice(indent.length) : l
    );
    const before = lines.slice(Math.max(0, i - 20), i).join("\n");
    const text = lines.slice(previousEnd, i).join("\n");
    const saveAs = [...text.matchAll(SAVE_AS)].at(-1)?.[1];
    blocks.push({
      file,
      line: i + 1,
      lang,
      ignored: /\bignore\b/.test(rest),
      // One line, so that the sample keeps its line numbers after it.
      prelude: PRELUDE.exec(before)?.[1].trim().replace(/\s*\n\s*/g, " ") ?? "",
      ...(saveAs ? { saveAs } : {}),
      code: body.join("\n"),
    });
    previousEnd = end + 1;
    i = end;
  }
  return blocks;
}
