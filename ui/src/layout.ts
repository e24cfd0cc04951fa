// The graph layout (dagre), run in a Web Worker so that a big graph never freezes the page.
import dagre from "@dagrejs/dagre";

export type LayoutRequest = {
  nodes: { id: string; width: number; height: number }[];
  edges: [string, string][];
  options: { rankdir: "TB" | "LR"; nodesep: number; ranksep: number };
};

export type Box = { id: string; x: number; y: number; width: number; height: number };

export type Laid = {
  width: number;
  height: number;
  boxes: Box[];
  edges: { from: string; to: string; d: string }[];
};

export function layOut({ nodes, edges, options }: LayoutRequest): Laid {
  const g = new dagre.graphlib.Graph();
  g.setGraph({ ...options, marginx: 8, marginy: 8 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const n of nodes) g.setNode(n.id, { width: n.width, height: n.height });
  for (const [from, to] of edges) if (g.hasNode(from) && g.hasNode(to)) g.setEdge(from, to);
  dagre.layout(g);
  const boxes = g.nodes().map((id) => {
    const n = g.node(id);
    return { id, x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height };
  });
  const laidEdges = g.edges().map((e) => {
    const points: { x: number; y: number }[] = g.edge(e).points ?? [];
    const d = points.map((p, i) => `${i === 0 ? "M" : "L"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    return { from: e.v, to: e.w, d };
  });
  const graph = g.graph();
  return { width: graph.width ?? 0, height: graph.height ?? 0, boxes, edges: laidEdges };
}
