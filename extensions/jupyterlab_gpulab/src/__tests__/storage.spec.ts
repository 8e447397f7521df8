import { gbText, IStorage, storageLevel, StorageNotices, storageText, storageTitle } from '../storage';

const GiB = 1024 ** 3;

function answer(usedGb: number, quotaGb = 50, over: Partial<IStorage> = {}): IStorage {
  const percent = (100 * usedGb) / quotaGb;
  const level = percent >= 95 ? 'critical' : percent >= 80 ? 'warn' : null;
  return {
    enforced: true,
    free_gb: '50',
    price_per_gb_day: '0.01',
    currency: 'CNY',
    home: {
      used_bytes: Math.round(usedGb * GiB),
      quota_bytes: quotaGb * GiB,
      enforced: true,
      measured_at: 1_800_000_000
    },
    datasets_bytes: 0,
    percent,
    notice: level ? { level, text: `Your home is ${Math.round(percent)} % full.` } : null,
    ...over
  };
}

describe('the status bar item', () => {
  it('says how much of the quota the home holds, in GB', () => {
    expect(storageText(answer(12.3))).toBe('Home 12.3 / 50 GB');
    expect(storageText(answer(0))).toBe('Home 0.0 / 50 GB');
    expect(storageText(answer(150, 500))).toBe('Home 150 / 500 GB');
    // A tiny test quota (64 MiB) still reads as a size, not "0.1 / 0.1".
    expect(storageText(answer(0.0537, 0.0625))).toBe('Home 0.0537 / 0.0625 GB');
    expect(gbText(GiB / 16)).toBe('0.0625');
  });

  it('counts the published datasets against the quota', () => {
    const s = answer(10, 50, { datasets_bytes: 5 * GiB });
    expect(storageText(s)).toBe('Home 15.0 / 50 GB');
    expect(storageTitle(s, 1_800_000_030)).toContain('Includes 5.0 GB in your published datasets');
  });

  it('turns amber at 80 % and red at 95 %', () => {
    expect(storageLevel(79.9)).toBe('ok');
    expect(storageLevel(80)).toBe('warn');
    expect(storageLevel(94.99)).toBe('warn');
    expect(storageLevel(95)).toBe('critical');
    expect(storageLevel(120)).toBe('critical');
  });

  it('says when the hub measured it, the price, and when the quota is not enforced', () => {
    const title = storageTitle(answer(1), 1_800_000_012);
    expect(title).toContain('measured by the hub 12 s ago');
    expect(title).toContain('50 GB free; above it CNY 0.01 per GB a day');
    expect(title).not.toContain('not enforced');
    const loose = answer(1);
    loose.home.enforced = false;
    expect(storageTitle(loose, 1_800_000_012)).toContain('not enforced');
  });
});

describe('notifications', () => {
  it('are raised once per level per session', () => {
    const n = new StorageNotices();
    expect(n.next(answer(10))).toBeNull();
    expect(n.next(answer(41))?.level).toBe('warn');
    expect(n.next(answer(42))).toBeNull(); // still above 80 %: nothing new
    expect(n.next(answer(39))).toBeNull();
    expect(n.next(answer(41))).toBeNull(); // back above 80 %: told already
    expect(n.next(answer(48))?.level).toBe('critical');
    expect(n.next(answer(49))).toBeNull();
  });

  it('go straight to critical for a home that jumps past 95 %', () => {
    const n = new StorageNotices();
    const first = n.next(answer(49));
    expect(first?.level).toBe('critical');
    expect(first?.text).toBe('Your home is 98 % full.');
    expect(n.next(answer(41))).toBeNull(); // the 80 % notice has nothing to add now
  });
});
