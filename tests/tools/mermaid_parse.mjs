// Parses Mermaid flowcharts with Mermaid's own parser and prints what it understood.
// stdin: a JSON array of diagram texts. stdout: a JSON array with, for each text, either
// {"ok": true, "diagramType", "direction", "vertices": [...], "edges": [...], "classes": {...}}
// or {"ok": false, "error": "<the parser's message>"}.
// Mermaid's sanitiser needs a DOM, which jsdom provides; nothing is rendered.
import { readFileSync } from "node:fs";
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import("mermaid");
// maxEdges: renderers refuse more than 500 edges by default; that is a rendering policy (the
// CLI warns about it), while this script checks syntax, so it parses graphs of any size.
mermaid.initialize({ startOnLoad: false, securityLevel: "strict", maxEdges: 1_000_000 });

// The parser keeps entity codes (#quot; #35;) as placeholders that rendering decodes; decode
// them the same way so "text" is what a reader sees.
function decodeEntities(text) {
  const html = text
    .replace(/\ufb02\u00b0\u00b0(\d+)\u00b6\u00df/g, "&#$1;")
    .replace(/\ufb02\u00b0(\w+)\u00b6\u00df/g, "&$1;");
  const element = document.createElement("textarea");
  element.innerHTML = html;
  return element.value;
}

function values(collection) {
  return collection instanceof Map ? [...collection.values()] : Object.values(collection);
}

async function understand(text) {
  try {
    await mermaid.parse(text);
    const diagram = await mermaid.mermaidAPI.getDiagramFromText(text);
    const db = diagram.db;
    const classes = {};
    for (const [name, definition] of (db.getClasses() instanceof Map
      ? db.getClasses()
      : Object.entries(db.getClasses()))) {
      classes[name] = definition.styles;
    }
    return {
      ok: true,
      diagramType: diagram.type,
      direction: db.getDirection(),
      vertices: values(db.getVertices()).map((vertex) => ({
        id: vertex.id,
        text: decodeEntities(vertex.text ?? ""),
        shape: vertex.type ?? null,
        classes: vertex.classes,
      })),
      edges: db.getEdges().map((edge) => ({
        start: edge.start,
        end: edge.end,
        stroke: edge.stroke,
        text: decodeEntities(edge.text ?? ""),
      })),
      classes,
    };
  } catch (error) {
    return { ok: false, error: String(error?.message ?? error) };
  }
}

const texts = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const text of texts) {
  results.push(await understand(text));
}
process.stdout.write(JSON.stringify(results));
