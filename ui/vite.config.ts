import { defineConfig } from "vite";

// Fixed file names: the broker embeds exactly these files (crates/ferrymq-http/src/ui.rs) and
// tells browsers of a change by ETag. One script, one stylesheet: no chunks to list.
export default defineConfig({
  base: "./",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  // `npm run dev` serves the source with live reload and sends API calls to a broker running on
  // the default address (FERRYMQ_HTTP to name another).
  server: {
    // A key starting with `^` is a regular expression: `/node` alone must not catch `/node_modules`.
    proxy: {
      "^/(topics|stats|status|history|node|cluster|connections|session|login|logout|users)(/|\\?|$)": process.env.FERRYMQ_HTTP ?? "http://127.0.0.1:7080",
    },
  },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2020",
    modulePreload: false,
    cssCodeSplit: false,
    assetsInlineLimit: 0,
    reportCompressedSize: false,
    rollupOptions: {
      output: {
        entryFileNames: "assets/app.js",
        chunkFileNames: "assets/app-[name].js",
        assetFileNames: "assets/app[extname]",
        inlineDynamicImports: true,
      },
    },
  },
});
