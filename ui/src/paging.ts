// Following a list's `continue`. Across namespaces the read API may end a page short, even
// empty, with a `continue`: it stopped after judging 100 namespaces the caller may not read
// (docs/api.md). A view reads on from there by itself, but only a few pages at a time, so
// one behind thousands of such namespaces costs the server a bounded number of requests.

/** The most pages one read follows after the first before it stops short. */
export const MAX_FOLLOWS = 5;

export type Listed<T> = { items: T[]; continue: string | null };

/** Up to `want` items from `cursor` on: the first page, then its `continue` while the pages
 * come back short, at most MAX_FOLLOWS times. The `continue` returned is where the next read
 * starts, null at the end; with fewer than `want` items it means the follow-ups ran out. */
export async function collect<T>(
  read: (limit: number, cursor: string | null) => Promise<Listed<T>>,
  want: number,
  cursor: string | null,
): Promise<Listed<T>> {
  const items: T[] = [];
  let next = cursor;
  for (let follows = 0; follows <= MAX_FOLLOWS; follows++) {
    const page = await read(want - items.length, next);
    items.push(...page.items);
    next = page.continue;
    if (next === null || items.length >= want) break;
  }
  return { items, continue: next };
}
