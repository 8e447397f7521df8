import {
  cardName,
  gibText,
  gpuItemText,
  gpuItemTitle,
  IGpuCard,
  IGpuUsage,
  idleText,
  isUnavailable,
  meanUtil,
  memoryText,
  NudgeEpisodes,
  pollDelay,
  utilText
} from '../gpuusage';

function card(over: Partial<IGpuCard> = {}): IGpuCard {
  return {
    uuid: 'GPU-1',
    index: 0,
    type: 'a100-80g',
    util_pct: 37.4,
    mem_used_mib: 1229,
    mem_total_mib: 81920,
    power_w: 212.6,
    temp_c: 51,
    simulated: false,
    processes: [{ pid: 4242, used_mib: 1200 }],
    ...over
  };
}

function usage(cards: IGpuCard[], over: Partial<IGpuUsage> = {}): IGpuUsage {
  return {
    user: 'ada',
    server: '',
    cards,
    idle_seconds: 0,
    idle_minutes: 8,
    nudge: null,
    ...over
  };
}

const NUDGE = {
  idle_seconds: 495,
  text: 'GPU idle for 8 min: switch to no-GPU mode and pay CNY 0.09/h instead of 2.10',
  price_now: '2.10',
  price_no_gpu: '0.09',
  currency: 'CNY'
};

describe('the GPU status item', () => {
  it('shows utilisation and memory of a real card', () => {
    expect(gpuItemText(usage([card()]))).toBe('GPU 37% · 1.2/80 GiB');
    expect(gibText(81920 * 2)).toBe('160');
  });

  it('sums memory and averages utilisation over several cards', () => {
    const two = usage([card(), card({ uuid: 'GPU-2', util_pct: 62.6, mem_used_mib: 2048 })]);
    expect(meanUtil(two.cards)).toBeCloseTo(50);
    expect(memoryText(two.cards)).toBe('3.2/160 GiB');
    expect(gpuItemText(two)).toBe('2 GPUs 50% · 3.2/160 GiB');
  });

  it('says simulated where a simulated card has no memory to show', () => {
    const sim = card({ simulated: true, mem_used_mib: 0, processes: [] });
    expect(gpuItemText(usage([sim]))).toBe('GPU 37% · simulated');
    expect(gpuItemTitle(usage([sim]))).toContain('a100-80g #0 (simulated): 37% busy, 213 W');
    expect(gpuItemTitle(usage([sim]))).not.toContain('GiB');
    // Cards are named by their type's display name where the catalog gives one.
    const names = (slug: string) => ({ 'a100-80g': 'A100-80G' })[slug] || slug;
    expect(gpuItemTitle(usage([sim]), names)).toContain('A100-80G #0 (simulated): 37% busy');
    expect(cardName(card({ type: null, index: 3 }))).toBe('GPU #3');
  });

  it('hides without cards and waits for the first reading', () => {
    expect(gpuItemText(usage([]))).toBe('');
    const unread = card({ util_pct: null, mem_used_mib: null, simulated: null });
    expect(gpuItemText(usage([unread]))).toBe('GPU …');
    expect(gpuItemTitle(usage([unread]))).toContain('not measured yet');
  });

  it('says n/a for a card read without a utilisation figure, with its other figures', () => {
    // NVML gives no utilisation (and no power) for some cards: the hub sends null, not 0.
    const blind = card({ util_pct: null, power_w: null });
    expect(gpuItemText(usage([blind], { idle_seconds: null }))).toBe('GPU n/a · 1.2/80 GiB');
    const title = gpuItemTitle(usage([blind], { idle_seconds: null }));
    expect(title).toContain('a100-80g #0: utilisation n/a, 1.2/80 GiB, 51 °C');
    expect(title).not.toContain('not measured yet');
    expect(title).not.toContain('Idle');
    // With a measured card beside it, the measured one's figure stands.
    expect(gpuItemText(usage([blind, card({ uuid: 'GPU-2', util_pct: 80 })]))).toBe(
      '2 GPUs 80% · 2.4/160 GiB'
    );
    expect(utilText(blind)).toBe('n/a');
    expect(utilText(card())).toBe('37%');
  });

  it('turns into the idle time once the hub nudges, with the nudge in the tooltip', () => {
    const idle = usage([card({ util_pct: 0 })], { idle_seconds: 495, nudge: NUDGE });
    expect(gpuItemText(idle)).toBe('GPU idle 8 min');
    const title = gpuItemTitle(idle);
    expect(title).toContain('Idle for 8 min.');
    expect(title).toContain('pay CNY 0.09/h instead of 2.10');
    expect(title).toContain('Measured by the hub');
  });

  it('tells an unavailable answer from figures', () => {
    expect(isUnavailable({ available: false, message: 'hub away' })).toBe(true);
    expect(isUnavailable(usage([card()]))).toBe(false);
  });
});

describe('idle times', () => {
  it('reads as seconds, minutes, then hours', () => {
    expect(idleText(12.7)).toBe('12 s');
    expect(idleText(60)).toBe('1 min');
    expect(idleText(8 * 60 + 59)).toBe('8 min');
    expect(idleText(3600 + 5 * 60)).toBe('1 h 05 min');
  });
});

describe('the nudge', () => {
  it('is announced once per idle episode, withdrawn when the cards work again', () => {
    const episodes = new NudgeEpisodes();
    const busy = usage([card()]);
    const idle = usage([card({ util_pct: 0 })], { nudge: NUDGE });
    expect(episodes.next(busy)).toBe('none');
    expect(episodes.next(idle)).toBe('show');
    expect(episodes.next(idle)).toBe('none'); // still idle: not again (nor after a dismissal)
    expect(episodes.next(busy)).toBe('end');
    expect(episodes.next(busy)).toBe('none');
    expect(episodes.next(idle)).toBe('show'); // a new episode
  });
});

describe('polling', () => {
  it('asks every few seconds while seen, rarely when hidden, slower after failures', () => {
    expect(pollDelay(true, 0)).toBe(5_000);
    expect(pollDelay(false, 0)).toBe(60_000);
    expect(pollDelay(true, 1)).toBe(10_000);
    expect(pollDelay(true, 10)).toBe(60_000);
  });
});
