// The home's usage in the status bar ("Home 12.3 / 50 GB"): its text, its level (ok, warn at
// 80 %, critical at 95 %) and which notifications to raise. Pure logic (no JupyterLab imports),
// so jest tests it without a browser. The figures are the hub's own measurement of the home
// (GET /hub/api/users/NAME/storage, read by this server's extension with its own token).

export type StorageLevel = 'ok' | 'warn' | 'critical';

/** The hub's storage answer, as far as the status bar reads it. */
export interface IStorage {
  enforced: boolean;
  free_gb: string;
  price_per_gb_day: string;
  currency: string;
  home: {
    used_bytes: number;
    quota_bytes: number;
    enforced: boolean;
    measured_at: number;
  };
  datasets_bytes: number;
  percent: number;
  notice: { level: 'warn' | 'critical'; text: string } | null;
}

export const WARN_PERCENT = 80;
export const CRITICAL_PERCENT = 95;
const GiB = 1024 ** 3;

export function storageLevel(percent: number): StorageLevel {
  if (percent >= CRITICAL_PERCENT) {
    return 'critical';
  }
  return percent >= WARN_PERCENT ? 'warn' : 'ok';
}

/** A size in GB (2**30 bytes, as the catalog counts them): one decimal below 100 GB. */
export function gbText(bytes: number): string {
  const gb = bytes / GiB;
  if (gb >= 100) {
    return gb.toFixed(0);
  }
  if (gb > 0 && gb < 0.1) {
    return gb.toFixed(4).replace(/0+$/, ''); // a tiny (test) quota: 0.0625, not 0.1
  }
  return gb.toFixed(1);
}

/** "Home 12.3 / 50 GB": what the home and its owner's datasets hold, of the quota. */
export function storageText(s: IStorage): string {
  const held = s.home.used_bytes + (s.datasets_bytes || 0);
  // The quota is a size the user chose: "50", "62.5", not "50.0".
  const quota = gbText(s.home.quota_bytes).replace(/\.0$/, '');
  return `Home ${gbText(held)} / ${quota} GB`;
}

/** The item's tooltip: the figure in words, when it was measured, and the free size's price. */
export function storageTitle(s: IStorage, nowSeconds: number): string {
  const lines = [
    `Your home: ${Math.round(s.percent)} % of its quota used (measured by the hub ` +
      `${Math.max(0, Math.round(nowSeconds - s.home.measured_at))} s ago).`
  ];
  if (s.datasets_bytes > 0) {
    lines.push(`Includes ${gbText(s.datasets_bytes)} GB in your published datasets.`);
  }
  lines.push(
    `${s.free_gb} GB free; above it ${s.currency} ${s.price_per_gb_day} per GB a day. ` +
      'Change your quota on the hub home page.'
  );
  if (!s.home.enforced) {
    lines.push('The quota is not enforced on this hub.');
  }
  return lines.join('\n');
}

/**
 * One notification per level per session: the hub's notice at 80 % (warn) and at 95 %
 * (critical), each raised once while this page lives, even as the figure wanders around the
 * threshold. A home that goes straight to 95 % gets the critical one only.
 */
export class StorageNotices {
  private told = new Set<StorageLevel>();

  /** What to announce for this answer (nothing, or the hub's notice once for its level). */
  next(s: IStorage): { level: 'warn' | 'critical'; text: string } | null {
    const notice = s.notice;
    if (!notice || this.told.has(notice.level)) {
      return null;
    }
    this.told.add(notice.level);
    if (notice.level === 'critical') {
      this.told.add('warn'); // past 95 % the 80 % notice has nothing to add
    }
    return notice;
  }
}
