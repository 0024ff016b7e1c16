// Numbers with their units and times in the browser's own zone.

const integer = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

export function count(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return integer.format(n);
}

/** A rate in messages per second. */
export function rate(perSecond: number | null | undefined): string {
  if (perSecond === null || perSecond === undefined || !Number.isFinite(perSecond)) return "–";
  return `${perSecond < 10 && perSecond !== 0 ? decimal.format(perSecond) : integer.format(perSecond)} msg/s`;
}

const byteUnits = ["B", "KiB", "MiB", "GiB", "TiB"];
export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  let unit = 0;
  let value = n;
  while (value >= 1024 && unit < byteUnits.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? integer.format(value) : decimal.format(value)} ${byteUnits[unit]}`;
}

/** A duration given in microseconds (the broker's latency figures). */
export function micros(us: number | null | undefined): string {
  if (us === null || us === undefined || !Number.isFinite(us)) return "–";
  if (us < 1000) return `${integer.format(us)} µs`;
  return millis(us / 1000);
}

/** A duration given in milliseconds. */
export function millis(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "–";
  if (ms < 1000) return `${decimal.format(ms)} ms`;
  const s = ms / 1000;
  if (s < 120) return `${decimal.format(s)} s`;
  const min = s / 60;
  if (min < 120) return `${decimal.format(min)} min`;
  const h = min / 60;
  if (h < 48) return `${decimal.format(h)} h`;
  return `${decimal.format(h / 24)} d`;
}

const timeFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  timeZoneName: "short",
});

/** A Unix time in ms, in the browser's time zone. */
export function time(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || ms === 0) return "–";
  return timeFormat.format(new Date(ms));
}

export function percent(part: number, whole: number): string {
  if (!whole) return "–";
  return `${decimal.format((100 * part) / whole)} %`;
}

/** `1 message`, `2 messages`: a count with its noun. */
export function plural(n: number, noun: string): string {
  return `${count(n)} ${n === 1 ? noun : noun + "s"}`;
}
