// Issue 22, "one price everywhere": the status bar's price and tooltip are the hub's price for
// THIS server (billing's own price function), never the on-demand price of its type.
import { gpuChoices, ICatalog, IPool, IStatus, priceNow, statusParts } from '../logic';
import { GpulabSession, ISessionApi } from '../model';

function status(over: Partial<IStatus> = {}): IStatus {
  return {
    gpulab: true,
    user: 'ada',
    mode: 'RTX 4090 x1 (simulated)',
    gpu_type: 'rtx-4090',
    gpu_count: 1,
    simulated: true,
    pricing: 'on-demand',
    price_per_hour: '0.68', // what the hub wrote into the server at its start
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

describe('one price in the status bar', () => {
  it('shows the spot price the hub answers on a spot server, not the on-demand price', () => {
    // Filed: the spot tooltip showed "Price: CNY 0.68/h (spot)" while spot was 0.51.
    const spot = status({ pricing: 'spot' });
    const parts = statusParts(spot, null, (1000 + 3600) * 1000, '0.51');
    expect(parts.price).toBe('CNY 0.51/h');
    expect(parts.title).toContain('Price: CNY 0.51/h (spot, now)');
    expect(parts.title).not.toContain('0.68');
    expect(parts.cost).toBe('session ≈ CNY 0.5100');
  });

  it('says it does not know a spot price rather than showing the on-demand one', () => {
    const spot = status({ pricing: 'spot' });
    expect(priceNow(spot, null)).toBeNull();
    expect(statusParts(spot, null, 1000 * 1000, null).price).toBe('?/h');
  });

  it("shows an on-demand server's own price, as the hub wrote it (a student's: education)", () => {
    const course = status({ price_per_hour: '0.48' });
    expect(priceNow(course, '0.51')).toBe('0.48');
    expect(statusParts(course, null, 1000 * 1000).title).toContain('Price: CNY 0.48/h (on-demand)');
  });
});

describe('one price in the switch dialog and the no-GPU toggle', () => {
  const pool: IPool = {
    currency: 'CNY',
    no_gpu: { available: true, price_per_hour: '0.09' },
    gpu_types: [
      { slug: 'rtx-4090', display_name: 'RTX 4090', vram_gb: 24, on_demand_price: '0.68', total: 2, free: 1, simulated: 2 }
    ]
  };

  it("offers a course student the GPU at the hub's education price", () => {
    // Filed: a course student was shown 0.68 while billing charges 0.48.
    const student = {
      ...pool,
      your_prices: {
        gpu_types: { 'rtx-4090': { price_per_hour: '0.48', price_kind: 'education' } },
        no_gpu: { price_per_hour: '0.05', price_kind: 'education' }
      }
    };
    const [choice] = gpuChoices(student);
    expect(choice.price).toBe('0.48');
    expect(choice.label).toBe('RTX 4090 (simulated) — 1 of 2 free — CNY 0.48/h per card (education price)');
    // A hub that does not say keeps the on-demand price.
    expect(gpuChoices(pool)[0].price).toBe('0.68');
  });
});

describe("the no-GPU toggle's price", () => {
  it("is the hub's price for this user (a student's: the education price)", async () => {
    const catalog: ICatalog = {
      currency: 'CNY',
      max_gpus_per_server: 4,
      no_gpu: { display_name: 'No GPU', price_per_hour: '0.09', description: '' },
      gpu_types: {},
      datasets: {},
      your_prices: {
        gpu_types: {},
        no_gpu: { price_per_hour: '0.05', price_kind: 'education' }
      }
    };
    const api: ISessionApi = {
      getStatus: async () => status(),
      getBalance: async () => ({ available: false }),
      getCatalog: async () => catalog,
      pollServer: async () => null,
      reload: () => undefined
    };
    const session = new GpulabSession(status(), api);
    await session.loadCatalog();
    expect(session.noGpuPrice).toBe('0.05');
  });
});
