import { IBalance, ICatalog, IServerId, IStatus } from '../logic';
import { GpulabSession, ISessionApi } from '../model';

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

const catalog: ICatalog = {
  currency: 'CNY',
  max_gpus_per_server: 4,
  no_gpu: { display_name: 'No GPU', price_per_hour: '0.09', description: '' },
  gpu_types: {},
  datasets: {}
};

/** A fake server: each call answers what the test put in, and is counted. */
class FakeApi implements ISessionApi {
  status: IStatus | Error = status();
  balance: IBalance | Error = { available: true, balance: '100', currency: 'CNY' };
  catalog: ICatalog | Error = catalog;
  server: IServerId | null | Error = { gpulab: true, server_id: 'server-1' };
  reloads = 0;
  calls: string[] = [];

  private answer<T>(name: string, value: T | Error): Promise<T> {
    this.calls.push(name);
    return value instanceof Error ? Promise.reject(value) : Promise.resolve(value);
  }

  getStatus = () => this.answer('status', this.status);
  getBalance = () => this.answer('balance', this.balance);
  getCatalog = () => this.answer('catalog', this.catalog);
  pollServer = () => this.answer('ping', this.server);
  reload = () => {
    this.reloads += 1;
  };
}

describe('GpulabSession.create', () => {
  beforeEach(() => {
    jest.spyOn(console, 'warn').mockImplementation(() => undefined);
    jest.spyOn(console, 'info').mockImplementation(() => undefined);
  });
  afterEach(() => jest.restoreAllMocks());

  it('is a session on a gpulab server', async () => {
    const session = await GpulabSession.create(new FakeApi());
    expect(session).not.toBeNull();
    expect(session!.status.mode).toBe('A100-80G x1 (simulated)');
    expect(session!.catalog).toBeNull();
    expect(session!.noGpuPrice).toBeNull();
  });

  it('is null when the server was not started by gpulab', async () => {
    const api = new FakeApi();
    api.status = status({ gpulab: false });
    expect(await GpulabSession.create(api)).toBeNull();
  });

  it('is null when the server extension does not answer', async () => {
    const api = new FakeApi();
    api.status = new Error('HTTP 404 from status');
    expect(await GpulabSession.create(api)).toBeNull();
  });
});

describe('GpulabSession', () => {
  it('loads the catalog once and signals it', async () => {
    const api = new FakeApi();
    const session = new GpulabSession(status(), api);
    const seen: (ICatalog | null)[] = [];
    session.catalogChanged.connect((_, c) => seen.push(c));
    await Promise.all([session.loadCatalog(), session.loadCatalog(), session.catalogLoaded]);
    expect(api.calls.filter(c => c === 'catalog')).toHaveLength(1);
    expect(seen).toEqual([catalog]);
    expect(session.noGpuPrice).toBe('0.09');
    expect(session.catalogError).toBe('');
  });

  it('says why the catalog is unavailable', async () => {
    const api = new FakeApi();
    api.catalog = new Error('hub down');
    const session = new GpulabSession(status(), api);
    const seen: (ICatalog | null)[] = [];
    session.catalogChanged.connect((_, c) => seen.push(c));
    await session.catalogLoaded;
    expect(seen).toEqual([null]);
    expect(session.catalog).toBeNull();
    expect(session.catalogError).toBe('Catalog unavailable: hub down');
  });

  it('reads the balance, and billing not answering as unavailable', async () => {
    const api = new FakeApi();
    const session = new GpulabSession(status(), api);
    const seen: IBalance[] = [];
    session.balanceChanged.connect((_, b) => seen.push(b));
    await session.refreshBalance();
    expect(session.balance).toEqual({ available: true, balance: '100', currency: 'CNY' });
    api.balance = new Error('billing down');
    await session.refreshBalance();
    expect(session.balance).toEqual({ available: false, reason: 'billing down' });
    expect(seen).toHaveLength(2);
  });

  it('announces each low-balance warning once', async () => {
    const api = new FakeApi();
    const session = new GpulabSession(status({ low_balance_minutes: 30 }), api);
    const warned: string[][] = [];
    session.balanceWarned.connect((_, messages) => warned.push(messages));
    api.balance = {
      available: true,
      balance: '10',
      currency: 'CNY',
      time_left_seconds: 1200,
      warnings: ['Billing: balance low']
    };
    await session.refreshBalance();
    await session.refreshBalance(); // the same state: nothing new
    expect(warned).toHaveLength(1);
    expect(warned[0][0]).toBe('Billing: balance low');
    expect(warned[0][1]).toMatch(/^Low balance: CNY 10.00 lasts about 20m at/);
    api.balance = { ...api.balance, time_left_seconds: 240, warnings: [] };
    await session.refreshBalance(); // below 5 minutes: announced again
    expect(warned).toHaveLength(2);
    expect(warned[1]).toHaveLength(1);
  });

  it('refreshes the status and signals it', async () => {
    const api = new FakeApi();
    const session = new GpulabSession(status(), api);
    const seen: IStatus[] = [];
    session.statusChanged.connect((_, s) => seen.push(s));
    api.status = status({ session_cost: '0.35' });
    await session.refreshStatus();
    expect(session.status.session_cost).toBe('0.35');
    expect(seen).toHaveLength(1);
    expect(api.reloads).toBe(0);
  });

  it('reloads when another server process answers', async () => {
    const api = new FakeApi();
    const session = new GpulabSession(status(), api);
    const seen: IStatus[] = [];
    session.statusChanged.connect((_, s) => seen.push(s));
    api.server = { gpulab: true, server_id: 'server-2' };
    await session.refreshStatus();
    expect(api.reloads).toBe(1);
    expect(api.calls).not.toContain('status');
    expect(seen).toHaveLength(0);
  });

  it('keeps the last status while the server restarts', async () => {
    const api = new FakeApi();
    const session = new GpulabSession(status(), api);
    api.server = null; // nobody answers the ping
    api.status = new Error('HTTP 502 from status');
    await session.refreshStatus();
    expect(session.status.server_id).toBe('server-1');
    expect(api.reloads).toBe(0);
  });

  it('polls the balance and the status until stopped', async () => {
    jest.useFakeTimers();
    try {
      const api = new FakeApi();
      const session = new GpulabSession(status(), api);
      session.start(1000, 5000);
      session.start(1000, 5000); // a second start adds no timers
      await jest.advanceTimersByTimeAsync(0);
      expect(api.calls.filter(c => c === 'balance')).toHaveLength(1);
      expect(api.calls.filter(c => c === 'catalog')).toHaveLength(1);
      await jest.advanceTimersByTimeAsync(5000);
      expect(api.calls.filter(c => c === 'balance')).toHaveLength(6);
      expect(api.calls.filter(c => c === 'ping')).toHaveLength(1);
      session.stop();
      await jest.advanceTimersByTimeAsync(10000);
      expect(api.calls.filter(c => c === 'balance')).toHaveLength(6);
    } finally {
      jest.useRealTimers();
    }
  });
});
