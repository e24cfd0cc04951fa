// forEach items and skips as the run page shows them (docs/foreach.md, docs/api.md): a
// forEach task is one node of the graph whose items (task rows keyed `<task>[<item key>]`)
// are counted by state; a task skipped when the run was created (its `when` was false, or
// its list empty) is told apart from one skipped because an upstream task failed.
import { label } from "./format";

export function instanceKey(task: string, item: string): string {
  return `${task}[${item}]`;
}

/** `[task, item key]` of a run's task key; `[key, null]` for a task that is no item. */
export function splitInstance(key: string): [string, string | null] {
  const open = key.indexOf("[");
  if (open < 0 || !key.endsWith("]")) return [key, null];
  return [key.slice(0, open), key.slice(open + 1, -1)];
}

/** Each forEach task with items -> its items' states by item key, in the order given. */
export type Items = Map<string, Map<string, string>>;

export function itemsOf(states: Record<string, string>): Items {
  const items: Items = new Map();
  for (const [key, state] of Object.entries(states)) {
    const [task, item] = splitInstance(key);
    if (item === null) continue;
    let group = items.get(task);
    if (!group) items.set(task, (group = new Map()));
    group.set(item, state);
  }
  return items;
}

// the order counts are told in: what is done first, what waits last
export const STATE_ORDER = [
  "succeeded", "failed", "cancelled", "skipped", "running", "admitting", "awaiting", "ready", "waiting",
];
const ACTIVE = new Set(["running", "admitting"]);
const UNRESOLVED = new Set(["running", "admitting", "awaiting", "ready", "waiting"]);

export type Counts = [state: string, count: number][];

/** States counted, in STATE_ORDER (unknown ones last). */
export function countStates(states: Iterable<string>): Counts {
  const counts = new Map<string, number>();
  for (const state of states) counts.set(state, (counts.get(state) ?? 0) + 1);
  return ordered(counts);
}

/** Counts by state in STATE_ORDER (unknown ones last). */
export function ordered(counts: Map<string, number>): Counts {
  const rank = (s: string) => (STATE_ORDER.includes(s) ? STATE_ORDER.indexOf(s) : STATE_ORDER.length);
  return [...counts.entries()].sort((a, b) => rank(a[0]) - rank(b[0]));
}

export function countsText(counts: Counts): string {
  return counts.map(([state, n]) => `${n} ${label(state)}`).join(" · ");
}

/** The state a forEach node is coloured with: running while any item runs (or some are
 * done and some wait), else the first of failed, cancelled among the items, else theirs. */
export function groupState(counts: Counts): string {
  if (counts.length === 0) return "unknown";
  const total = counts.reduce((sum, [, n]) => sum + n, 0);
  const has = (state: string) => counts.some(([s, n]) => s === state && n > 0);
  const unresolved = counts.filter(([s]) => UNRESOLVED.has(s)).reduce((sum, [, n]) => sum + n, 0);
  if (counts.some(([s]) => ACTIVE.has(s)) || (unresolved > 0 && unresolved < total)) return "running";
  if (unresolved > 0) return has("ready") ? "ready" : has("awaiting") ? "awaiting" : "waiting";
  for (const state of ["failed", "cancelled"]) if (has(state)) return state;
  return counts.length === 1 ? counts[0][0] : "succeeded";
}

export type SkipKind = "condition" | "no-items" | "upstream";

const SKIP_KINDS: Record<string, SkipKind> = { ConditionFalse: "condition", NoItems: "no-items" };

export const SKIP_LABEL: Record<SkipKind, string> = {
  condition: "condition false",
  "no-items": "no items",
  upstream: "upstream failed",
};

export const SKIP_TITLE: Record<SkipKind, string> = {
  condition: "condition false: its when was false, so it ran nothing and its dependents ran as if it had succeeded",
  "no-items": "no items: its forEach list was empty, so it ran nothing and its dependents ran as if it had succeeded",
  upstream: "an upstream task failed, so it never started",
};

/** Why a task of the DAG (never a compensator or a finally task) was skipped: the reason
 * the API gives one skipped when the run was created, else an upstream task failed. */
export function skipKind(state: string | null | undefined, reason: string | null | undefined): SkipKind | null {
  if (state !== "skipped") return null;
  return (reason && SKIP_KINDS[reason]) || "upstream";
}
