import { layOut, type LayoutRequest } from "./layout";

self.onmessage = (event: MessageEvent<{ id: number; request: LayoutRequest }>) => {
  const { id, request } = event.data;
  self.postMessage({ id, laid: layOut(request) });
};
