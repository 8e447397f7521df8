// This server's GPUs as the hub measures them (GET /hub/api/gpulab/users/NAME/gpu, read by this
// server's extension with its own token): the status bar's "GPU 37% · 1.2/80 GiB", the panel's
// figures, the idle nudge's episodes and how often to ask. Pure logic (no JupyterLab imports),
// so jest tests it without a browser. Every figure is the hub's own reading (NVML on real cards;
// on simulated ones utilisation follows the server's CPU use), never what this server says.

/** One held card, as the hub read it (null figures: not read yet, or not given by NVML). */
export interface IGpuCard {
  uuid: string;
  index: number;
  type: string | null;
  util_pct: number | null;
  mem_used_mib: number | null;
  mem_total_mib: number | null;
  power_w: number | null;
  temp_c: number | null;
  simulated: boolean | null;
  processes: { pid: number; used_mib: number | null }[];
}

export interface IGpuNudge {
  idle_seconds: number;
  text: string;
  price_now: string;
  price_no_gpu: string;
  currency: string;
}

/** The hub's answer, as far as the item and the panel read it. */
export interface IGpuUsage {
  user: string;
  server: string;
  cards: IGpuCard[];
  idle_seconds: number | null;
  idle_minutes: number;
  nudge: IGpuNudge | null;
}

/** The extension's answer when the hub could not say. */
export interface IGpuUnavailable {
  available: false;
  message: string;
}

export function isUnavailable(answer: IGpuUsage | IGpuUnavailable): answer is IGpuUnavailable {
  return (answer as IGpuUnavailable).available === false;
}

/** Whether the hub has read this card at all (``simulated`` is null until its first reading). */
export function isRead(c: IGpuCard): boolean {
  return c.simulated !== null;
}

/** A card's utilisation for people: "37%", "n/a" where NVML gives none for a card it read. */
export function utilText(c: IGpuCard): string {
  return c.util_pct === null ? 'n/a' : `${Math.round(c.util_pct)}%`;
}

/** Mean utilisation of the cards read so far (null: none read yet, or none with a figure). */
export function meanUtil(cards: IGpuCard[]): number | null {
  const read = cards.filter(c => typeof c.util_pct === 'number');
  if (!read.length) {
    return null;
  }
  return read.reduce((sum, c) => sum + (c.util_pct as number), 0) / read.length;
}

/** MiB as GiB: one decimal below 100 GiB, none above. */
export function gibText(mib: number): string {
  const gib = mib / 1024;
  return gib >= 100 ? gib.toFixed(0) : gib.toFixed(1);
}

/** "1.2/80 GiB": used of total (a card's size reads as "80", not "80.0"). */
export function memoryPair(usedMib: number, totalMib: number): string {
  return `${gibText(usedMib)}/${gibText(totalMib).replace(/\.0$/, '')} GiB`;
}

/** "1.2/80 GiB" over the cards whose memory NVML read; '' when none did (simulated cards). */
export function memoryText(cards: IGpuCard[]): string {
  const read = cards.filter(
    c => !c.simulated && typeof c.mem_used_mib === 'number' && typeof c.mem_total_mib === 'number'
  );
  if (!read.length) {
    return '';
  }
  const used = read.reduce((s, c) => s + (c.mem_used_mib as number), 0);
  const total = read.reduce((s, c) => s + (c.mem_total_mib as number), 0);
  return memoryPair(used, total);
}

/** "8 min", "45 s", "1 h 05 min": how long the cards have been idle. */
export function idleText(seconds: number): string {
  if (seconds < 60) {
    return `${Math.max(0, Math.floor(seconds))} s`;
  }
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, '0')} min`;
}

/**
 * The status item's text: '' without cards (no-GPU mode: the item hides), "GPU idle 8 min" once
 * the hub nudges, else "GPU 37% · 1.2/80 GiB" ("2 GPUs 37% · …" for several; "simulated" in
 * place of the memory on simulated cards, which have none).
 */
export function gpuItemText(u: IGpuUsage): string {
  if (!u.cards.length) {
    return '';
  }
  const label = u.cards.length > 1 ? `${u.cards.length} GPUs` : 'GPU';
  if (u.nudge) {
    return `${label} idle ${idleText(u.nudge.idle_seconds)}`;
  }
  const util = meanUtil(u.cards);
  if (util === null && !u.cards.every(isRead)) {
    return `${label} …`;
  }
  const memory = memoryText(u.cards);
  const simulated = u.cards.every(c => c.simulated);
  const tail = memory || (simulated ? 'simulated' : '');
  // Read, but NVML gives no utilisation for these cards: "n/a", never a made-up 0%.
  const figure = util === null ? 'n/a' : `${Math.round(util)}%`;
  return `${label} ${figure}${tail ? ` · ${tail}` : ''}`;
}

/** A card's name for people: its type's display name (`typeName`) and index, "A100-80G #0". */
export function cardName(c: IGpuCard, typeName: (slug: string) => string = s => s): string {
  return `${c.type ? typeName(c.type) : 'GPU'} #${c.index}`;
}

/** The item's tooltip: each card's figures, the idle time and the nudge in full. */
export function gpuItemTitle(
  u: IGpuUsage,
  typeName: (slug: string) => string = s => s
): string {
  const lines = u.cards.map(c => {
    const name = cardName(c, typeName);
    if (!isRead(c)) {
      return `${name}: not measured yet`;
    }
    const parts = [c.util_pct === null ? 'utilisation n/a' : `${utilText(c)} busy`];
    if (!c.simulated && c.mem_used_mib !== null && c.mem_total_mib !== null) {
      parts.push(memoryPair(c.mem_used_mib, c.mem_total_mib));
    }
    if (c.power_w !== null) {
      parts.push(`${Math.round(c.power_w)} W`);
    }
    if (c.temp_c !== null) {
      parts.push(`${Math.round(c.temp_c)} °C`);
    }
    return `${name}${c.simulated ? ' (simulated)' : ''}: ${parts.join(', ')}`;
  });
  if (u.idle_seconds !== null && u.idle_seconds >= 60) {
    lines.push(`Idle for ${idleText(u.idle_seconds)}.`);
  }
  if (u.nudge) {
    lines.push(u.nudge.text);
  }
  lines.push('Measured by the hub. Click for the GPU panel.');
  return lines.join('\n');
}

/** Milliseconds until the next ask: every few seconds while the page is seen, rarely when the
 * tab is hidden, and longer after failures (the hub or the server is away). */
export function pollDelay(visible: boolean, failures: number): number {
  const base = visible ? 5_000 : 60_000;
  const backoff = Math.min(2 ** Math.max(0, failures), 12);
  return base * backoff;
}

/**
 * The nudge is announced once per idle episode: when the hub first nudges, and again only after
 * the cards worked (the hub's nudge went away) and fell idle again. Dismissing it keeps it quiet
 * for the rest of the episode.
 */
export class NudgeEpisodes {
  private shown = false;

  /** 'show' (announce it now), 'end' (withdraw an announced one) or 'none'. */
  next(u: IGpuUsage): 'show' | 'end' | 'none' {
    if (u.nudge) {
      if (this.shown) {
        return 'none';
      }
      this.shown = true;
      return 'show';
    }
    if (this.shown) {
      this.shown = false;
      return 'end';
    }
    return 'none';
  }
}
