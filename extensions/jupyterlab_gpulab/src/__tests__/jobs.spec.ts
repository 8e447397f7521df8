// Issue 26, the JupyterLab Jobs panel's logic: "a JupyterLab panel that submits the open script or
// notebook" (python FILE / jupyter execute FILE from the file's folder), the form's choices as
// the hub's request, the job's line, and a log followed to its end.
import {
  attemptsText,
  IJob,
  ILogChunk,
  jobCommandFor,
  jobOn,
  LogFollower,
  shellQuote,
  stateText,
  submitBody
} from '../jobs';

function job(over: Partial<IJob> = {}): IJob {
  return {
    id: 17,
    name: '',
    command: 'python train.py',
    cwd: '',
    gpu: 'a100-80g',
    gpus: 2,
    nodes: 1,
    pricing: 'on-demand',
    max_price: null,
    state: 'running',
    reason: '',
    exit_code: null,
    attempts: [],
    submitted_at: '2026-12-03T12:00:00Z',
    ...over
  };
}

describe('the command that runs the open file', () => {
  it('runs a script with python and a notebook with jupyter execute, from its folder', () => {
    expect(jobCommandFor('train.py')).toEqual({
      command: 'python train.py',
      cwd: '',
      kind: 'script'
    });
    expect(jobCommandFor('projects/mnist/Train model.ipynb')).toEqual({
      command: "jupyter execute 'Train model.ipynb'",
      cwd: 'projects/mnist',
      kind: 'notebook'
    });
    expect(jobCommandFor('/a/b.PY')?.cwd).toBe('a');
  });

  it('refuses what it cannot run', () => {
    for (const path of ['', 'notes.txt', 'data/.py', 'x.ipynb.bak', 'folder/']) {
      expect(jobCommandFor(path)).toBeNull();
    }
  });

  it('quotes a file name so that the shell sees one word, whatever it holds', () => {
    expect(shellQuote('train.py')).toBe('train.py');
    expect(shellQuote("it's; rm -rf ~.py")).toBe(`'it'"'"'s; rm -rf ~.py'`);
    expect(shellQuote('$(id).py')).toBe("'$(id).py'");
    expect(jobCommandFor('$(touch x).py')?.command).toBe("python '$(touch x).py'");
  });
});

describe('the submit request', () => {
  const base = {
    command: ' python train.py ',
    cwd: 'p',
    name: '',
    gpu: 'a100-80g',
    gpus: '2',
    nodes: '1',
    spot: false,
    bid: ''
  };

  it('sends the choices, numbers as numbers, and a bid only for spot', () => {
    expect(submitBody(base)).toEqual({
      command: 'python train.py',
      cwd: 'p',
      gpu: 'a100-80g',
      gpus: 2,
      nodes: 1
    });
    expect(submitBody({ ...base, spot: true, bid: '1.50', name: ' run 3 ' })).toEqual({
      command: 'python train.py',
      cwd: 'p',
      name: 'run 3',
      gpu: 'a100-80g',
      gpus: 2,
      nodes: 1,
      pricing: 'spot',
      max_price: '1.50'
    });
  });

  it('sends no cards without a GPU, and what was typed when it is not a number', () => {
    expect(submitBody({ ...base, gpu: 'none', spot: true, bid: '9' })).toEqual({
      command: 'python train.py',
      cwd: 'p',
      gpu: 'none',
      gpus: 0
    });
    // The hub answers "gpus: ..." naming what is allowed; the panel does not guess.
    expect(submitBody({ ...base, gpus: 'two' }).gpus).toBe('two');
  });
});

describe("a job's line", () => {
  it('says what it runs on, its state and its attempts', () => {
    const names = (slug: string) => ({ 'a100-80g': 'A100-80G' })[slug] || slug;
    expect(jobOn(job(), names)).toBe('A100-80G x2');
    expect(jobOn(job({ nodes: 2, pricing: 'spot', max_price: '1.5' }), names)).toBe(
      'A100-80G x2 · 2 nodes · spot (bid 1.5)'
    );
    expect(jobOn(job({ gpu: 'none', gpus: 0 }), names)).toBe('No GPU');
    expect(stateText(job({ state: 'failed', exit_code: 3 }))).toBe('failed (exit 3)');
    expect(stateText(job({ state: 'succeeded', exit_code: 0 }))).toBe('succeeded (exit 0)');
    expect(stateText(job({ cancel_requested: true }))).toBe('cancelling');
    const attempt = {
      started_at: null,
      running_at: null,
      ended_at: null,
      end: null,
      exit_code: null
    };
    const twice = job({
      attempts: [
        { ...attempt, n: 1, end: 'preempted' },
        { ...attempt, n: 2, resume_seconds: 42 }
      ],
      lost_seconds: 300
    });
    expect(attemptsText(twice)).toBe('attempt 2 · resumed in 42 s · 5 min of work lost');
    expect(attemptsText(job())).toBe('');
  });
});

describe('following a log', () => {
  it('reads from the last offset until the job ended and nothing more came', async () => {
    const output = 'step 1\nstep 2\nfinal loss 0.5\n';
    let written = 7; // bytes the job has printed so far
    let ended = false;
    const offsets: number[] = [];
    const read = async (offset: number): Promise<ILogChunk> => {
      offsets.push(offset);
      return { text: output.slice(offset, written), next_offset: written, done: null };
    };
    const follower = new LogFollower(read, async () => ended);
    let shown = '';
    shown += (await follower.step()).text;
    expect(follower.done).toBe(false);
    written = output.length;
    ended = true; // it ended right after printing the rest: that rest is still read
    const step = await follower.step();
    shown += step.text;
    expect(step.more).toBe(true);
    expect(follower.done).toBe(false);
    expect((await follower.step()).more).toBe(false);
    expect(follower.done).toBe(true);
    expect(shown).toBe(output);
    expect(offsets).toEqual([0, 7, output.length]);
  });

  it("believes the hub's own word on the end when it gives one", async () => {
    const follower = new LogFollower(
      async offset => ({ text: '', next_offset: offset, done: true }),
      async () => {
        throw new Error('not asked');
      }
    );
    await follower.step();
    expect(follower.done).toBe(true);
  });
});
