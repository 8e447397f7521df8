import {
  checkpointText,
  endMessage,
  formatCountdown,
  IPreemption,
  ISpotStatus,
  PeriodicSave,
  spotPriceText,
  spotTitle,
  SpotTracker,
  warningDetails,
  warningMessage
} from '../spot';

const HUB_T0 = 1_800_000_000; // the hub's clock at the first answer (seconds)

function preemption(over: Partial<IPreemption> = {}): IPreemption {
  return {
    id: 'p-1',
    status: 'warning',
    reason: 'price-above-max',
    price: '0.60',
    max_price: '0.40',
    warned_at: HUB_T0,
    deadline: HUB_T0 + 20,
    seconds_left: 20,
    cancelled_at: null,
    stopped_at: null,
    signalled: 0,
    checkpoint: null,
    ...over
  };
}

function spot(over: Partial<ISpotStatus> = {}): ISpotStatus {
  return {
    spot: true,
    available: true,
    running: true,
    gpu_type: 'rtx-4090',
    price: '0.42',
    max_price: '0.60',
    currency: 'CNY',
    warning_seconds: 300,
    time: HUB_T0,
    preemption: null,
    queued: null,
    ...over
  };
}

describe('spot price in the status bar', () => {
  it('shows the spot price and the bid', () => {
    expect(spotPriceText(spot(), 1, 'CNY')).toBe('spot CNY 0.42/h (max 0.60)');
  });

  it('says the price is per card on multi-card servers', () => {
    expect(spotPriceText(spot({ price: '0.3', max_price: '0.5' }), 2, 'CNY')).toBe(
      'spot 2 × CNY 0.30/h (max 0.50)'
    );
  });

  it('leaves the bid out when the server has none on record', () => {
    expect(spotPriceText(spot({ max_price: null }), 1, 'CNY')).toBe('spot CNY 0.42/h');
  });

  it('says when the hub does not answer, and why in the tooltip', () => {
    const down: ISpotStatus = { spot: true, available: false, reason: 'connection refused' };
    expect(spotPriceText(down, 1, 'CNY')).toBe('spot price unavailable');
    expect(spotTitle(down, 'CNY')).toBe('Spot price unavailable: connection refused');
    expect(spotPriceText(null, 1, 'CNY')).toBe('spot …');
  });

  it('explains the bid and the warning in the tooltip', () => {
    const title = spotTitle(spot(), 'CNY');
    expect(title).toContain('Spot price: CNY 0.42/h per card; your max price: CNY 0.60/h.');
    expect(title).toContain('after a 5:00 warning');
  });
});

describe('formatCountdown', () => {
  it('counts minutes and seconds, and hours when long', () => {
    expect(formatCountdown(299.2)).toBe('4:59');
    expect(formatCountdown(7)).toBe('0:07');
    expect(formatCountdown(3723)).toBe('1:02:03');
  });

  it('never goes negative, and says ? without a number', () => {
    expect(formatCountdown(-3)).toBe('0:00');
    expect(formatCountdown(null)).toBe('?');
    expect(formatCountdown(NaN)).toBe('?');
  });
});

describe('SpotTracker', () => {
  it('announces a new warning once, then polls fast until it ends', () => {
    const t = new SpotTracker();
    expect(t.update(spot(), 0)).toEqual([]);
    expect(t.pollMs(10000, 2000)).toBe(10000);
    expect(t.warning).toBeNull();

    const events = t.update(spot({ preemption: preemption() }), 1000);
    expect(events.map(e => e.kind)).toEqual(['warning']);
    expect(t.warning?.id).toBe('p-1');
    expect(t.pollMs(10000, 2000)).toBe(2000);
    // The same warning again: nothing new to announce (the documents are not saved again).
    expect(t.update(spot({ time: HUB_T0 + 2, preemption: preemption() }), 3000)).toEqual([]);
  });

  it('counts down on the hub clock, whatever the local clock says', () => {
    const t = new SpotTracker();
    // The local clock is 7 minutes ahead of the hub: a countdown from Date.now() would say 0.
    const localMs = (HUB_T0 + 420) * 1000;
    t.update(spot({ time: HUB_T0 + 5, preemption: preemption() }), localMs);
    expect(t.secondsLeft(localMs)).toBeCloseTo(15);
    expect(t.secondsLeft(localMs + 10_000)).toBeCloseTo(5);
    expect(t.secondsLeft(localMs + 60_000)).toBe(0);
    // The local wall time of the deadline, for "stops at 14:05:30".
    expect(t.deadlineLocalMs()).toBe(localMs + 15_000);
  });

  it('keeps counting from the last answer while the hub does not answer', () => {
    const t = new SpotTracker();
    t.update(spot({ preemption: preemption() }), 0);
    const events = t.update({ spot: true, available: false, reason: 'timeout' }, 4000);
    expect(events).toEqual([]);
    expect(t.warning?.id).toBe('p-1');
    expect(t.secondsLeft(4000)).toBeCloseTo(16);
    expect(t.pollMs(10000, 2000)).toBe(2000);
  });

  it('says "cancelled" when the warning it showed is cancelled, and stops the countdown', () => {
    const t = new SpotTracker();
    t.update(spot({ preemption: preemption() }), 0);
    const cancelled = preemption({ status: 'cancelled', cancelled_at: HUB_T0 + 6 });
    const events = t.update(spot({ time: HUB_T0 + 6, price: '0.35', preemption: cancelled }), 6000);
    expect(events.map(e => e.kind)).toEqual(['cancelled']);
    expect(t.warning).toBeNull();
    expect(t.secondsLeft(7000)).toBeNull();
    expect(t.pollMs(10000, 2000)).toBe(10000);
    expect(endMessage(events[0], spot({ price: '0.35', max_price: '0.40' }), 'CNY')).toBe(
      'Preemption cancelled: this server keeps running (spot price now CNY 0.35/h, your max 0.40).'
    );
    // Seen again on later polls: announced once only.
    expect(t.update(spot({ preemption: cancelled }), 8000)).toEqual([]);
  });

  it('says "stopped" when the deadline came', () => {
    const t = new SpotTracker();
    t.update(spot({ preemption: preemption() }), 0);
    const stopped = preemption({ status: 'stopped', stopped_at: HUB_T0 + 20 });
    const events = t.update(
      spot({ running: false, price: null, time: HUB_T0 + 21, preemption: stopped }),
      21000
    );
    expect(events.map(e => e.kind)).toEqual(['stopped']);
    expect(endMessage(events[0], null, 'CNY')).toContain('reclaimed and stopped');
  });

  it('announces nothing for preemptions that ended before the page opened', () => {
    const t = new SpotTracker();
    const old = preemption({ status: 'cancelled', deadline: HUB_T0 - 600 });
    expect(t.update(spot({ preemption: old }), 0)).toEqual([]);
    expect(t.update(spot({ preemption: preemption({ id: 'p-0', status: 'stopped' }) }), 0)).toEqual(
      []
    );
    expect(t.warning).toBeNull();
  });

  it('ends an old warning and starts the new one when a second preemption follows', () => {
    const t = new SpotTracker();
    t.update(spot({ preemption: preemption() }), 0);
    const second = preemption({ id: 'p-2', deadline: HUB_T0 + 400 });
    const events = t.update(spot({ time: HUB_T0 + 100, preemption: second }), 100_000);
    expect(events.map(e => [e.kind, e.preemption.id])).toEqual([
      ['cleared', 'p-1'],
      ['warning', 'p-2']
    ]);
    expect(t.secondsLeft(100_000)).toBeCloseTo(300);
  });

  it('reports the checkpoint result once it arrives', () => {
    const t = new SpotTracker();
    t.update(spot({ preemption: preemption() }), 0);
    const checkpoint = {
      state: 'done' as const,
      exit_code: 0,
      error: null,
      command: 'python save.py',
      log: '~/.gpulab/checkpoints/20261130T011500Z.log'
    };
    const events = t.update(spot({ preemption: preemption({ checkpoint }) }), 2000);
    expect(events.map(e => e.kind)).toEqual(['checkpoint']);
    expect(t.update(spot({ preemption: preemption({ checkpoint }) }), 4000)).toEqual([]);
    expect(checkpointText(checkpoint)).toBe(
      'Your checkpoint command finished (exit 0). Output: ~/.gpulab/checkpoints/20261130T011500Z.log'
    );
  });

  it('ignores on-demand servers', () => {
    const t = new SpotTracker();
    expect(t.update({ spot: false, pricing: 'on-demand' }, 0)).toEqual([]);
    expect(t.secondsLeft(0)).toBeNull();
  });
});

describe('warning texts', () => {
  it('fit a JupyterLab notification (140 characters) and say why, when and what was saved', () => {
    const failed = {
      state: 'failed' as const,
      exit_code: null,
      error: 'timed out after 240s',
      command: 'python save.py',
      log: '~/.gpulab/checkpoints/x.log'
    };
    const text = warningMessage(
      preemption({ checkpoint: failed }),
      17.4,
      'CNY',
      'All open documents saved.'
    );
    expect(text).toBe(
      'Spot server stops in 0:17 (spot price CNY 0.60/h > your max 0.40). ' +
        'All open documents saved. Checkpoint: failed (timed out after 240s).'
    );
    expect(text.length).toBeLessThanOrEqual(140);
    const long = warningMessage(preemption({ reason: 'x'.repeat(300) }), 5, 'CNY', '');
    expect(long.length).toBe(140);
    expect(warningMessage(preemption(), 0, 'CNY', '')).toBe(
      'Spot server is stopping now (spot price CNY 0.60/h > your max 0.40).'
    );
    expect(
      warningMessage(preemption({ reason: 'on-demand-reclaim' }), 299, 'CNY', 'Saving open documents…')
    ).toBe('Spot server stops in 4:59 (an on-demand user needs this GPU). Saving open documents…');
    expect(warningMessage(preemption({ reason: 'reserved' }), 60, 'CNY', '')).toBe(
      'Spot server stops in 1:00 (this GPU is reserved (a lab session or a monthly reservation)).'
    );
  });

  it('give the whole story in the details', () => {
    const lines = warningDetails(
      preemption({ signalled: 2 }),
      '14:05:30',
      'CNY',
      'All open documents saved.'
    );
    expect(lines[0]).toBe(
      'This spot server is reclaimed because the spot price (CNY 0.60/h) rose above your max ' +
        'price (CNY 0.40/h).'
    );
    expect(lines[1]).toContain('It stops at 14:05:30 unless the preemption is cancelled');
    expect(lines).toContain('All open documents saved.');
    expect(lines.some(l => l.startsWith('2 process(es)'))).toBe(true);
  });
});

describe('PeriodicSave', () => {
  const spot = (over: Partial<ISpotStatus> = {}): ISpotStatus => ({
    spot: true,
    available: true,
    running: true,
    time: HUB_T0,
    save_interval_seconds: 900,
    ...over
  });

  it('saves every interval from the page start, and the warning save restarts it', () => {
    const p = new PeriodicSave();
    expect(p.due(spot(), 0)).toBe(false); // the clock starts here
    expect(p.due(spot(), 899_000)).toBe(false);
    expect(p.due(spot(), 900_000)).toBe(true);
    expect(p.due(spot(), 901_000)).toBe(false);
    p.saved(1_000_000); // saved at a warning
    expect(p.due(spot(), 1_800_000)).toBe(false);
    expect(p.due(spot(), 1_900_000)).toBe(true);
  });

  it('never saves on a server that is not spot, or with the interval off', () => {
    const p = new PeriodicSave();
    for (const t of [0, 1_000_000, 10_000_000]) {
      expect(p.due({ spot: false, pricing: 'on-demand' }, t)).toBe(false);
      expect(p.due(null, t)).toBe(false);
    }
    const off = new PeriodicSave();
    for (const t of [0, 1_000_000, 10_000_000]) {
      expect(off.due(spot({ save_interval_seconds: 0 }), t)).toBe(false);
    }
  });

  it('goes on with the last interval while the hub does not answer', () => {
    const p = new PeriodicSave();
    p.due(spot({ save_interval_seconds: 5 }), 0);
    const down: ISpotStatus = { spot: true, available: false, reason: 'the hub did not answer' };
    expect(p.due(down, 4_000)).toBe(false);
    expect(p.due(down, 5_000)).toBe(true);
  });
});
