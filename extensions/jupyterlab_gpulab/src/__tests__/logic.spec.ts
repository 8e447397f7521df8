import {
  datasetsAfter,
  formatDuration,
  formatMoney,
  gpuChoices,
  IPool,
  IServerId,
  IStatus,
  newBalanceWarnings,
  noGpuLabel,
  plainLabUrl,
  priceChange,
  sessionCost,
  statusParts,
  waitForNewServer
} from '../logic';

function status(over: Partial<IStatus> = {}): IStatus {
  return {
    gpulab: true,
    user: 'ada',
    mode: 'A100-80G x1 (simulated)',
    gpu_type: 'a100-80g',
    gpu_count: 1,
    simulated: true,
    pricing: 'on-demand',
    price_per_hour: '2.10',
    currency: 'CNY',
    image: 'base',
    datasets: [],
    allocation_id: 'alloc-1',
    started_at: 1000,
    elapsed_seconds: 0,
    session_cost: '0',
    low_balance_minutes: 30,
    server_id: 'server-1',
    ...over
  };
}

const pool: IPool = {
  currency: 'CNY',
  no_gpu: { available: true, price_per_hour: '0.09' },
  gpu_types: [
    { slug: 'rtx-4090', display_name: 'RTX 4090', vram_gb: 24, on_demand_price: '0.68', total: 2, free: 0, simulated: 2 },
    { slug: 'a100-80g', display_name: 'A100-80G', vram_gb: 80, on_demand_price: '2.10', total: 2, free: 1, simulated: 2 },
    { slug: 'h100-80g', display_name: 'H100-80G', vram_gb: 80, on_demand_price: '3.80', total: 0, free: 0, simulated: 0 }
  ]
};

describe('formatting', () => {
  it('formats money with the currency, precise below 1', () => {
    expect(formatMoney('2.1', 'CNY')).toBe('CNY 2.10');
    expect(formatMoney(0.00123, 'CNY', true)).toBe('CNY 0.0012');
    expect(formatMoney(12.5, 'CNY', true)).toBe('CNY 12.50');
    expect(formatMoney(null, 'CNY')).toBe('?');
    expect(formatMoney('abc', 'CNY')).toBe('?');
  });

  it('formats durations for humans', () => {
    expect(formatDuration(59)).toBe('<1m');
    expect(formatDuration(300)).toBe('5m');
    expect(formatDuration(7500)).toBe('2h 05m');
    expect(formatDuration(200000)).toBe('2d 7h');
    expect(formatDuration(null)).toBe('?');
  });

  it('labels the no-GPU command with its price', () => {
    expect(noGpuLabel('0.09', 'CNY')).toBe('Switch to no-GPU mode (CNY 0.09/h)');
  });
});

describe('status bar', () => {
  it('computes the session cost from price and start time', () => {
    // 30 minutes at 2.10/h
    expect(sessionCost(status(), (1000 + 1800) * 1000)).toBeCloseTo(1.05, 6);
    expect(sessionCost(status({ price_per_hour: null }), 0)).toBeNull();
  });

  it('shows mode, price, cost and balance with time left', () => {
    const parts = statusParts(
      status(),
      { available: true, balance: '9.5', currency: 'CNY', time_left_seconds: 16200 },
      (1000 + 60) * 1000
    );
    expect(parts.mode).toBe('A100-80G x1 (simulated)');
    expect(parts.price).toBe('CNY 2.10/h');
    expect(parts.cost).toBe('session ≤ CNY 0.0350');
    expect(parts.balance).toBe('balance CNY 9.50 (4h 30m left)');
    expect(parts.title).toContain('simulated');
  });

  it('says "balance unavailable" when billing is not reachable', () => {
    const parts = statusParts(
      status(),
      { available: false, reason: 'billing service not running' },
      1000 * 1000
    );
    expect(parts.balance).toBe('balance unavailable');
    expect(parts.title).toContain('billing service not running');
  });
});

describe('choices and plans', () => {
  it('lists GPU types with free cards and price, disabling full ones', () => {
    const choices = gpuChoices(pool);
    expect(choices.map(c => c.slug)).toEqual(['rtx-4090', 'a100-80g']);
    expect(choices[0].disabled).toBe(true);
    expect(choices[1].disabled).toBe(false);
    expect(choices[1].label).toBe('A100-80G (simulated) — 1 of 2 free — CNY 2.10/h per card');
  });

  it('describes the price change', () => {
    expect(priceChange('2.10', '0.09', 'CNY')).toBe('Price: CNY 2.10/h → CNY 0.09/h.');
    expect(priceChange('2.10', '2.1', 'CNY')).toBe('The price stays CNY 2.10/h.');
  });

  it('mounts and unmounts datasets without duplicates', () => {
    expect(datasetsAfter(['a'], 'b', true)).toEqual(['a', 'b']);
    expect(datasetsAfter(['a', 'b'], 'a', true)).toEqual(['b', 'a']);
    expect(datasetsAfter(['a', 'b'], 'a', false)).toEqual(['b']);
  });
});

describe('low-balance warnings', () => {
  it('notifies billing warnings once and our own once per threshold crossed', () => {
    const shown = new Set<string>();
    const low = { available: true, balance: '0.5', currency: 'CNY', time_left_seconds: 900, warnings: ['Balance below CNY 1'] };
    const first = newBalanceWarnings(low, 30, shown);
    expect(first).toHaveLength(2);
    expect(first[0]).toBe('Balance below CNY 1');
    expect(first[1]).toMatch(/^Low balance: CNY 0.50 lasts about 15m/);
    expect(newBalanceWarnings({ ...low, time_left_seconds: 880 }, 30, shown)).toEqual([]);
    expect(newBalanceWarnings({ ...low, time_left_seconds: 500 }, 30, shown)).toHaveLength(1);
    expect(newBalanceWarnings({ ...low, time_left_seconds: 450 }, 30, shown)).toEqual([]);
    expect(newBalanceWarnings({ ...low, time_left_seconds: 30 }, 30, shown)).toHaveLength(1);
  });

  it('is silent when billing is unavailable or the balance lasts', () => {
    const shown = new Set<string>();
    expect(newBalanceWarnings({ available: false }, 30, shown)).toEqual([]);
    expect(
      newBalanceWarnings({ available: true, balance: '9', time_left_seconds: 36000 }, 30, shown)
    ).toEqual([]);
  });
});

describe('waiting for the restarted server', () => {
  function clock() {
    let t = 0;
    return { now: () => t, sleep: async (ms: number) => void (t += ms) };
  }

  it('ignores errors, hub pages and the old server until a new server answers', async () => {
    const answers: Array<IServerId | null | Error> = [
      { gpulab: true, server_id: 'server-1' }, // the old server still answering
      new Error('connection refused'),
      null, // a hub "server not ready" page
      { gpulab: true, server_id: '' },
      { gpulab: true, server_id: 'server-2' }
    ];
    const c = clock();
    const ticks: number[] = [];
    const result = await waitForNewServer({
      fetchServer: async () => {
        const a = answers.shift();
        if (a instanceof Error) {
          throw a;
        }
        return a ?? null;
      },
      oldServerId: 'server-1',
      intervalMs: 100,
      ...c,
      onTick: ms => ticks.push(ms)
    });
    expect(result.server_id).toBe('server-2');
    expect(ticks).toEqual([0, 100, 200, 300]);
  });

  it('gives up after the timeout', async () => {
    const c = clock();
    await expect(
      waitForNewServer({
        fetchServer: async () => ({ gpulab: true, server_id: 'server-1' }),
        oldServerId: 'server-1',
        intervalMs: 1000,
        timeoutMs: 5000,
        ...c
      })
    ).rejects.toThrow('did not answer within 5 s');
  });
});

describe('plainLabUrl', () => {
  it('is true for the default workspace with no file or query', () => {
    expect(plainLabUrl('', '')).toBe(true);
    expect(plainLabUrl('', '?foo=1')).toBe(true);
  });

  it('is false when the URL opens a file or folder, resets or clones', () => {
    expect(plainLabUrl('work/train.ipynb', '')).toBe(false);
    expect(plainLabUrl('', '?reset')).toBe(false);
    expect(plainLabUrl('', '?clone=other')).toBe(false);
    expect(plainLabUrl('', '?path=a.ipynb')).toBe(false);
  });
});
