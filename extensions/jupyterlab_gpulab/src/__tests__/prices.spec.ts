// Issue 22, "one price everywhere": the status bar's price and tooltip are the hub's price for
// THIS server (billing's own price function), never the on-demand price of its type.
import { IStatus, priceNow, statusParts } from '../logic';

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
