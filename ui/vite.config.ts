import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

// The build is committed into the Python package, and a test rebuilds it and compares bytes:
// nothing in it may depend on the machine, the clock or the checkout's path.
// FLOWFORGE_UI_OUT lets that test build elsewhere without touching the checkout.
const outDir =
  process.env.FLOWFORGE_UI_OUT ??
  fileURLToPath(new URL("../operator/flowforge/server/static", import.meta.url));

export default defineConfig({
  base: "/",
  build: {
    outDir,
    emptyOutDir: true,
    sourcemap: false,
    target: "es2022",
    assetsInlineLimit: 0,
    chunkSizeWarningLimit: 400,
  },
  server: {
    host: "127.0.0.1",
    proxy: { "/api": process.env.FLOWFORGE_SERVER ?? "http://127.0.0.1:8080" },
  },
});
