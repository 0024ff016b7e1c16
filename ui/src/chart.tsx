// A live line chart (uPlot): made once, fed new data on every tick, sized to its container.

import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export interface Series {
  label: string;
  color: string;
  values: (number | null)[];
}

interface Props {
  title: string;
  /** Unix seconds. */
  t: number[];
  series: Series[];
  /** Formats a value on the axis and in the legend, with its unit. */
  format: (v: number) => string;
  height?: number;
}

export function Chart({ title, t, series, format, height = 200 }: Props) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const data = [t, ...series.map((s) => s.values)] as uPlot.AlignedData;

  useEffect(() => {
    const el = box.current!;
    const options: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      axes: [
        { stroke: "#55606b", grid: { stroke: "#eef1f4" } },
        { stroke: "#55606b", grid: { stroke: "#eef1f4" }, size: 90, values: (_u, splits) => splits.map(format) },
      ],
      series: [
        {},
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 2,
          spanGaps: false,
          value: (_u: uPlot, v: number | null) => (v === null || v === undefined ? "–" : format(v)),
        })),
      ],
    };
    plot.current = new uPlot(options, data, el);
    const resize = new ResizeObserver(() => {
      plot.current?.setSize({ width: Math.max(200, el.clientWidth), height });
    });
    resize.observe(el);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
  }, [series.length]);

  useEffect(() => {
    plot.current?.setData(data);
  });

  const latest = series.map((s) => {
    const v = s.values[s.values.length - 1];
    return `${s.label}: ${v === null || v === undefined ? "no data yet" : format(v)}`;
  });
  return (
    <figure class="chart" data-points={t.length}>
      <figcaption>{title}</figcaption>
      <div ref={box} role="img" aria-label={`${title}. Latest: ${latest.join(", ")}`} />
    </figure>
  );
}
