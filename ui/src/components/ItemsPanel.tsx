// The items of one forEach task: each item's key, state, attempts and how its last attempt
// ended; an item opens as a task does (its attempts and their logs).
import type { TaskBrief } from "../api";
import { duration } from "../format";
import { countStates, countsText, instanceKey } from "../items";
import { StateBadge } from "./Bits";

type Props = {
  task: string;
  /** Its items' states by item key (live). */
  items: Map<string, string>;
  /** The run's task briefs (none when the run is too big to list them). */
  briefs: TaskBrief[];
  onSelect: (key: string) => void;
  onClose: () => void;
};

export function ItemsPanel({ task, items, briefs, onSelect, onClose }: Props) {
  const byItem = new Map(briefs.filter((b) => b.forEach === task && b.item).map((b) => [b.item!, b]));
  // in the order the run lists them (item order), then any the briefs do not have yet
  const keys = [...new Set([...byItem.keys(), ...[...items.keys()].sort()])].filter((k) => items.has(k));
  return (
    <aside class="panel card" aria-labelledby="items-h" data-testid="items-panel" data-task={task}>
      <div class="panel-head">
        <h2 id="items-h">Task {task}: {items.size} items</h2>
        <button type="button" class="link" onClick={onClose} aria-label="Close the items">Close</button>
      </div>
      <p data-testid="item-counts">{countsText(countStates(items.values()))}</p>
      <table class="attempts">
        <thead><tr><th scope="col">Item</th><th scope="col">State</th><th scope="col">Attempts</th><th scope="col">Exit</th><th scope="col">Reason</th><th scope="col">Took</th></tr></thead>
        <tbody>
          {keys.map((key) => {
            const brief = byItem.get(key);
            const state = items.get(key);
            return (
              <tr key={key} data-item={key} data-state={state}>
                <td>
                  <button type="button" class="link" title="Its attempts and logs"
                    onClick={() => onSelect(instanceKey(task, key))}>{key}</button>
                </td>
                <td><StateBadge state={state} /></td>
                <td>{brief?.attempts ?? "—"}</td>
                <td>{brief?.exitCode ?? "—"}</td>
                <td>{brief?.reason ?? "—"}{brief?.message ? <div class="muted small">{brief.message}</div> : null}</td>
                <td>{duration(brief?.durationSeconds)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <p class="muted small">Choose an item for its attempts and their logs.</p>
    </aside>
  );
}
