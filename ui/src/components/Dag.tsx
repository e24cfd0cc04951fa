// A run's (or a definition's) graph, laid out by dagre. The layout depends only on the
// graph's shape and is computed once; live state changes only recolour it. Over
// MAX_DRAWN nodes the graph is drawn as one box per level with its state counts, so a
// 10,000-task run stays a page, not a frozen tab.
import dagre from "@dagrejs/dagre";
import { useMemo } from "preact/hooks";
import type { Graph } from "../api";
import { label, stateClass } from "../format";

export const MAX_DRAWN = 500;

const NODE_H = 44;
const STATE_ORDER = ["succeeded", "running", "admitting", "ready", "waiting", "failed", "cancelled", "skipped"];

type Box = { id: string; x: number; y: number; width: number; height: number };
type Laid = { width: number; height: number; boxes: Map<string, Box>; edges: { from: string; to: string; d: string }[] };

function layOut(
  nodes: { id: string; width: number; height: number }[],
  edges: [string, string][],
  options: { rankdir: "TB" | "LR"; nodesep: number; ranksep: number },
): Laid {
  const g = new dagre.graphlib.Graph();
  g.setGraph({ ...options, marginx: 8, marginy: 8 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const n of nodes) g.setNode(n.id, { width: n.width, height: n.height });
  for (const [from, to] of edges) if (g.hasNode(from) && g.hasNode(to)) g.setEdge(from, to);
  dagre.layout(g);
  const boxes = new Map<string, Box>();
  for (const id of g.nodes()) {
    const n = g.node(id);
    boxes.set(id, { id, x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height });
  }
  const laidEdges = g.edges().map((e) => {
    const points: { x: number; y: number }[] = g.edge(e).points ?? [];
    const d = points.map((p, i) => `${i === 0 ? "M" : "L"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    return { from: e.v, to: e.w, d };
  });
  const graph = g.graph();
  return { width: graph.width ?? 0, height: graph.height ?? 0, boxes, edges: laidEdges };
}

function nodeWidth(text: string): number {
  return Math.min(240, Math.max(110, 16 + text.length * 7.4));
}

function clip(text: string, width: number): string {
  const fits = Math.floor((width - 16) / 7.4);
  return text.length > fits ? `${text.slice(0, fits - 1)}…` : text;
}

export type DagProps = {
  graph: Graph;
  states: Record<string, string>;
  selected?: string | null;
  triggeredBy?: string | null;
  onSelect?: (task: string) => void;
  onSelectLevel?: (level: number) => void;
  selectedLevel?: number | null;
};

export function Dag(props: DagProps) {
  const big = props.graph.nodes.length > MAX_DRAWN;
  return (
    <div class="dag" data-testid="dag" data-graph-ready="true" data-mode={big ? "levels" : "tasks"}>
      {big ? <LevelDag {...props} /> : <TaskDag {...props} />}
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

function TaskDag({ graph, states, selected, triggeredBy, onSelect }: DagProps) {
  const laid = useMemo(
    () =>
      layOut(
        graph.nodes.map((n) => ({ id: n.id, width: nodeWidth(n.id), height: NODE_H })),
        graph.edges,
        { rankdir: "TB", nodesep: 28, ranksep: 46 },
      ),
    [graph],
  );
  return (
    <svg class="graph" role="group" aria-label={`Task graph, ${graph.nodes.length} tasks`}
      viewBox={`0 0 ${laid.width} ${laid.height}`} width={laid.width} height={laid.height}>
      <Arrowhead />
      {laid.edges.map((e) => <path key={`${e.from}>${e.to}`} class="edge" d={e.d} marker-end="url(#arrow)" />)}
      {graph.nodes.map((n) => {
        const box = laid.boxes.get(n.id)!;
        const state = states[n.id] ?? n.state;
        const trigger = n.id === triggeredBy;
        return (
          <g key={n.id} class={`node ${stateClass(state)}${selected === n.id ? " selected" : ""}${trigger ? " trigger" : ""}`}
            data-task={n.id} data-state={state ?? ""} transform={`translate(${box.x},${box.y})`}
            role={onSelect ? "button" : undefined} tabIndex={onSelect ? 0 : undefined}
            aria-pressed={onSelect ? selected === n.id : undefined}
            aria-label={`${n.id}, ${n.type}, ${label(state)}${trigger ? ", failed and triggered the rollback" : ""}`}
            {...(onSelect ? activate(() => onSelect(n.id)) : {})}>
            <title>{`${n.id} (${n.type}): ${label(state)}`}</title>
            <rect width={box.width} height={box.height} rx="6" />
            <text x="10" y="18" class="name">{clip(n.id, box.width)}</text>
            <text x="10" y="35" class="sub">{trigger ? "⚑ triggered rollback" : `${label(state)} · ${clip(n.type, box.width - 80)}`}</text>
          </g>
        );
      })}
    </svg>
  );
}

type Level = { level: number; total: number; counts: Map<string, number> };

function LevelDag({ graph, states, onSelectLevel, selectedLevel }: DagProps) {
  const levelOf = useMemo(() => new Map(graph.nodes.map((n) => [n.id, n.level])), [graph]);
  const laid = useMemo(() => {
    const levels = [...new Set(graph.nodes.map((n) => n.level))].sort((a, b) => a - b);
    const edges = new Set<string>();
    for (const [from, to] of graph.edges) {
      const a = levelOf.get(from);
      const b = levelOf.get(to);
      if (a !== undefined && b !== undefined && a !== b) edges.add(`${a}>${b}`);
    }
    return layOut(
      levels.map((l) => ({ id: String(l), width: 300, height: 64 })),
      [...edges].map((e) => e.split(">") as [string, string]),
      { rankdir: "TB", nodesep: 30, ranksep: 30 },
    );
  }, [graph, levelOf]);
  const levels = useMemo(() => {
    const byLevel = new Map<number, Level>();
    for (const n of graph.nodes) {
      let entry = byLevel.get(n.level);
      if (!entry) byLevel.set(n.level, (entry = { level: n.level, total: 0, counts: new Map() }));
      const state = states[n.id] ?? n.state ?? "unknown";
      entry.total += 1;
      entry.counts.set(state, (entry.counts.get(state) ?? 0) + 1);
    }
    return [...byLevel.values()];
  }, [graph, states]);
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
          const box = laid.boxes.get(String(lv.level))!;
          const ordered = [...lv.counts.entries()].sort(
            (a, b) => STATE_ORDER.indexOf(a[0]) - STATE_ORDER.indexOf(b[0]),
          );
          let x = 10;
          const summary = ordered.map(([s, c]) => `${c} ${label(s)}`).join(", ");
          return (
            <g key={lv.level} class={`node level${selectedLevel === lv.level ? " selected" : ""}`}
              data-level={lv.level} transform={`translate(${box.x},${box.y})`} role="button" tabIndex={0}
              aria-pressed={selectedLevel === lv.level}
              aria-label={`Level ${lv.level}, ${lv.total} tasks: ${summary}`}
              {...activate(() => onSelectLevel?.(lv.level))}>
              <title>{`Level ${lv.level}: ${summary}`}</title>
              <rect width={box.width} height={box.height} rx="6" />
              <text x="10" y="18" class="name">Level {lv.level} · {lv.total.toLocaleString("en")} tasks</text>
              {ordered.map(([s, c]) => {
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
}
