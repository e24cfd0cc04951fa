// A run's (or a definition's) graph, laid out by dagre. The layout depends only on the
// graph's shape and is computed once; live state changes only recolour it. A forEach task is
// one node with its items counted by state; a task skipped when the run was created (its
// condition false) is drawn apart from one skipped because an upstream task failed. Over
// MAX_DRAWN nodes the graph is drawn as one box per level with its state counts, so a
// 10,000-task run stays a page, not a frozen tab.
import type { ComponentChildren } from "preact";
import { useEffect, useMemo } from "preact/hooks";
import type { Graph, GraphNode } from "../api";
import { label, stateClass } from "../format";
import {
  countStates, countsText, groupState, ordered, SKIP_LABEL, SKIP_TITLE, skipKind, splitInstance,
  type Counts, type Items, type SkipKind,
} from "../items";
import type { Laid } from "../layout";
import { useLayout } from "../useLayout";

// Over this many tasks (or edges) a graph is drawn by level: dagre's crossing reduction
// grows much faster than the graph, and a drawing of thousands of boxes is unreadable.
export const MAX_DRAWN = 300;
const MAX_DRAWN_EDGES = 900;

const NODE_H = 44;
// a forEach node: room for the name, its items' bar and their counts, and the stack behind
const GROUP_W = 264;
const GROUP_H = 62;
const STACK = 5;
// the node type the API gives an approval gate (a task that waits for people, no Job)
export const GATE_TYPE = "approval";

/** What a node's type reads as: a gate's is its own kind of task. */
function shownType(type: string): string {
  return type === GATE_TYPE ? "approval gate" : type;
}

// wide enough for the name, and for "succeeded · TYPE" / "⚑ triggered rollback" /
// "skipped · condition false" below it
function nodeWidth(name: string, type: string): number {
  const chars = Math.max(name.length, 0.87 * (type.length + 12), 0.87 * 25);
  return Math.min(240, Math.max(110, 18 + chars * 7.4));
}

function clip(text: string, width: number): string {
  const fits = Math.floor((width - 16) / 7.4);
  return text.length > fits ? `${text.slice(0, fits - 1)}…` : text;
}

/** What a node shows: its state (a forEach node's from its items), its items counted by
 * state (none for a task without items), and why it was skipped. */
export type NodeView = { state: string | null; counts: Counts | null; skip: SkipKind | null };

export function nodeView(n: GraphNode, states: Record<string, string>, items?: Items): NodeView {
  const members = n.forEach ? items?.get(n.id) : undefined;
  if (members && members.size > 0) {
    const counts = countStates(members.values());
    return { state: groupState(counts), counts, skip: null };
  }
  const state = states[n.id] ?? n.state ?? null;
  return { state, counts: null, skip: skipKind(state, n.reason) };
}

export type DagProps = {
  graph: Graph;
  states: Record<string, string>;
  /** The run's forEach items' states, by task (from the same states). */
  items?: Items;
  selected?: string | null;
  triggeredBy?: string | null;
  onSelect?: (task: string) => void;
  onSelectLevel?: (level: number) => void;
  selectedLevel?: number | null;
  /** Called once the graph is drawn. */
  onDrawn?: () => void;
};

export function drawnByLevel(graph: Graph): boolean {
  return graph.nodes.length > MAX_DRAWN || graph.edges.length > MAX_DRAWN_EDGES;
}

export function Dag(props: DagProps) {
  return drawnByLevel(props.graph) ? <LevelDag {...props} /> : <TaskDag {...props} />;
}

/** The frame of a drawing: says "laying out" until the worker answers. */
function Frame({ laid, mode, onDrawn, children }: {
  laid: Laid | null; mode: string; onDrawn?: () => void; children: (laid: Laid) => ComponentChildren;
}) {
  useEffect(() => {
    if (laid) onDrawn?.();
  }, [laid]);
  return (
    <div class="dag" data-testid="dag" data-mode={mode} data-graph-ready={laid ? "true" : "false"} aria-busy={!laid}>
      {laid ? children(laid) : <p class="muted" role="status">Laying out the graph…</p>}
    </div>
  );
}

function Arrowhead() {
  return (
    <defs>
      <marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
        <path d="M0,0 L10,5 L0,10 z" class="arrowhead" />
      </marker>
    </defs>
  );
}

function activate(handler: () => void) {
  return {
    onClick: handler,
    onKeyDown: (e: KeyboardEvent) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        handler();
      }
    },
  };
}

function TaskDag({ graph, states, items, selected, triggeredBy, onSelect, onDrawn }: DagProps) {
  const request = useMemo(
    () => ({
      nodes: graph.nodes.map((n) => n.forEach
        ? { id: n.id, width: GROUP_W, height: GROUP_H }
        : { id: n.id, width: nodeWidth(n.id, shownType(n.type)), height: NODE_H }),
      edges: graph.edges,
      options: { rankdir: "TB" as const, nodesep: 28, ranksep: 46 },
    }),
    [graph],
  );
  const laid = useLayout(request);
  return <Frame laid={laid} mode="tasks" onDrawn={onDrawn}>{(laid) => {
  const boxes = new Map(laid.boxes.map((b) => [b.id, b]));
  return (
    <svg class="graph" role="group" aria-label={`Task graph, ${graph.nodes.length} tasks`}
      viewBox={`0 0 ${laid.width} ${laid.height}`} width={laid.width} height={laid.height}>
      <Arrowhead />
      {laid.edges.map((e) => <path key={`${e.from}>${e.to}`} data-edge={`${e.from}>${e.to}`} class="edge" d={e.d} marker-end="url(#arrow)" />)}
      {graph.nodes.map((n) => {
        const box = boxes.get(n.id);
        if (!box) return null;
        const { state, counts, skip } = nodeView(n, states, items);
        // the rollback's trigger may be one item of a forEach: its node is the task's
        const trigger = triggeredBy != null && splitInstance(triggeredBy)[0] === n.id;
        const gate = n.type === GATE_TYPE;
        const what = shownType(n.type);
        const told = `${label(state)}${skip ? `, ${SKIP_LABEL[skip]}` : ""}`;
        const common = {
          "data-task": n.id, "data-state": state ?? "", "data-type": n.type,
          transform: `translate(${box.x},${box.y})`,
          role: onSelect ? ("button" as const) : undefined, tabIndex: onSelect ? 0 : undefined,
          "aria-pressed": onSelect ? selected === n.id : undefined,
          ...(onSelect ? activate(() => onSelect(n.id)) : {}),
        };
        const marks = `${selected === n.id ? " selected" : ""}${trigger ? " trigger" : ""}`;
        const rolled = trigger ? ", an item failed and triggered the rollback" : "";
        if (counts) {
          const total = counts.reduce((sum, [, c]) => sum + c, 0);
          const text = countsText(counts);
          const w = box.width - STACK;
          let x = 10;
          return (
            <g key={n.id} class={`node foreach ${stateClass(state)}${marks}`} {...common}
              data-for-each="true" data-items={total} data-counts={counts.map(([s, c]) => `${s}=${c}`).join(" ")}
              aria-label={`${n.id}, ${what}, for each of ${total} items: ${text}${rolled}`}>
              <title>{`${n.id} (${what}), for each of ${total} items: ${text}`}</title>
              <rect class="stack" x={STACK} y={STACK} width={w} height={box.height - STACK} rx="6" />
              <rect class="face" width={w} height={box.height - STACK} rx="6" />
              <text x="10" y="18" class="name">{clip(`${n.id} ×${total}`, w)}</text>
              {counts.map(([s, c]) => {
                const width = Math.max(2, ((w - 20) * c) / total);
                const seg = <rect key={s} class={`seg ${stateClass(s)}`} x={x} y="25" width={width} height="8" />;
                x += width;
                return seg;
              })}
              <text x="10" y="48" class="sub">{clip(trigger ? `⚑ ${text}` : text, w / 0.87)}</text>
            </g>
          );
        }
        const sub = trigger ? "⚑ triggered rollback"
          : gate && state === "awaiting" ? "awaiting approval"
          : skip ? `skipped · ${SKIP_LABEL[skip]}` : `${label(state)} · ${what}${n.forEach ? " · for each" : ""}`;
        return (
          <g key={n.id} class={`node ${stateClass(state)}${gate ? " gate" : ""}${skip ? ` skip-${skip}` : ""}${marks}`}
            {...common} data-skip={skip ?? undefined}
            aria-label={`${n.id}, ${what}, ${told}${trigger ? ", failed and triggered the rollback" : ""}`}>
            <title>{`${n.id} (${what}): ${skip ? `skipped, ${SKIP_TITLE[skip]}` : label(state)}`}</title>
            <rect width={box.width} height={n.forEach ? NODE_H : box.height} rx={gate ? box.height / 2 : 6} />
            <text x={gate ? 16 : 10} y="18" class="name">{clip(n.id, box.width)}</text>
            <text x={gate ? 16 : 10} y="35" class="sub">{clip(sub, box.width / 0.87)}</text>
          </g>
        );
      })}
    </svg>
  );
  }}</Frame>;
}

type Level = { level: number; total: number; counts: Map<string, number> };

function LevelDag({ graph, states, items, onSelectLevel, selectedLevel, onDrawn }: DagProps) {
  const request = useMemo(() => {
    const levelOf = new Map<string, number>();
    for (const n of graph.nodes) levelOf.set(n.id, n.level);
    const count = Math.max(0, ...levelOf.values()) + 1;
    const edges = new Map<number, [string, string]>();
    for (const [from, to] of graph.edges) {
      const a = levelOf.get(from);
      const b = levelOf.get(to);
      // Only level n-1 -> n: every task of level n has a dependency there (a level is a depth), and
      // the edges that skip levels would each give dagre a dummy node per level skipped (seconds
      // on a 100-level run) while drawing nothing a reader of the summary needs.
      if (a !== undefined && b !== undefined && b === a + 1) edges.set(a * count + b, [String(a), String(b)]);
    }
    return {
      nodes: [...new Set(levelOf.values())].sort((a, b) => a - b).map((l) => ({ id: String(l), width: 300, height: 64 })),
      edges: [...edges.values()],
      options: { rankdir: "TB" as const, nodesep: 30, ranksep: 30 },
    };
  }, [graph]);
  const laid = useLayout(request);
  // a forEach task counts as its items
  const levels = useMemo(() => {
    const byLevel = new Map<number, Level>();
    for (const n of graph.nodes) {
      let entry = byLevel.get(n.level);
      if (!entry) byLevel.set(n.level, (entry = { level: n.level, total: 0, counts: new Map() }));
      const { state, counts } = nodeView(n, states, items);
      for (const [s, c] of counts ?? [[state ?? "unknown", 1]]) {
        entry.total += c;
        entry.counts.set(s, (entry.counts.get(s) ?? 0) + c);
      }
    }
    return [...byLevel.values()];
  }, [graph, states, items]);
  return <Frame laid={laid} mode="levels" onDrawn={onDrawn}>{(laid) => {
  const boxes = new Map(laid.boxes.map((b) => [b.id, b]));
  return (
    <>
      <p class="muted small">
        {graph.nodes.length.toLocaleString("en")} tasks: too many to draw one by one, so each box is one
        level of the graph with its tasks counted by state. Choose a level to list its tasks.
      </p>
      <svg class="graph" role="group" aria-label={`Task graph by level, ${levels.length} levels`}
        viewBox={`0 0 ${laid.width} ${laid.height}`} width={laid.width} height={laid.height}>
        <Arrowhead />
        {laid.edges.map((e) => <path key={`${e.from}>${e.to}`} class="edge" d={e.d} marker-end="url(#arrow)" />)}
        {levels.map((lv) => {
          const box = boxes.get(String(lv.level));
          if (!box) return null;
          const counted = ordered(lv.counts);
          let x = 10;
          const summary = counted.map(([s, c]) => `${c} ${label(s)}`).join(", ");
          return (
            <g key={lv.level} class={`node level${selectedLevel === lv.level ? " selected" : ""}`}
              data-level={lv.level} transform={`translate(${box.x},${box.y})`} role="button" tabIndex={0}
              aria-pressed={selectedLevel === lv.level}
              aria-label={`Level ${lv.level}, ${lv.total} tasks: ${summary}`}
              {...activate(() => onSelectLevel?.(lv.level))}>
              <title>{`Level ${lv.level}: ${summary}`}</title>
              <rect width={box.width} height={box.height} rx="6" />
              <text x="10" y="18" class="name">Level {lv.level} · {lv.total.toLocaleString("en")} tasks</text>
              {counted.map(([s, c]) => {
                const w = Math.max(2, ((box.width - 20) * c) / lv.total);
                const r = <rect key={s} class={`seg ${stateClass(s)}`} x={x} y="26" width={w} height="10" />;
                x += w;
                return r;
              })}
              <text x="10" y="54" class="sub">{clip(summary, box.width)}</text>
            </g>
          );
        })}
      </svg>
    </>
  );
  }}</Frame>;
}
