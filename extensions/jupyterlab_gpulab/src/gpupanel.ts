// The GPU panel (left sidebar): this server's cards as the hub measures them, each with its
// utilisation, memory, power, temperature and processes (where NVML gives them; simulated cards
// have none, and the panel says so), how long they have been idle, and the hub's idle nudge with
// a button to the no-GPU switch (its own confirmation dialog).
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  cardName,
  gibText,
  IGpuCard,
  IGpuUsage,
  idleText,
  isRead,
  memoryPair
} from './gpuusage';
import { el, gpuIcon } from './widgets';

function bar(label: string, percent: number, text: string): HTMLElement {
  const row = el('div', 'jp-gpulab-bar-row');
  const track = el('div', 'jp-gpulab-bar');
  const fill = el('div', 'jp-gpulab-bar-fill');
  fill.style.width = `${Math.max(0, Math.min(100, percent))}%`;
  track.appendChild(fill);
  row.append(el('span', 'jp-gpulab-bar-label', label), track, el('span', 'jp-gpulab-bar-text', text));
  return row;
}

export interface IGpuPanelActions {
  /** Ask for fresh figures now (the panel was opened). */
  refresh(): void;
  /** The nudge's button: the no-GPU switch, with its own confirmation. */
  switchToNoGpu(): void;
  /** The nudge's "Dismiss": quiet until the cards work and fall idle again. */
  dismiss(): void;
  /** A GPU type's display name ("A100-80G") from its slug. */
  typeName(slug: string): string;
}

export class GpuUsagePanel extends Widget {
  private body = el('div', 'jp-gpulab-gpus');
  /** The nudge was dismissed for this idle episode: the panel shows it as a plain line. */
  dismissed = false;

  constructor(private actions: IGpuPanelActions) {
    super();
    this.id = 'gpulab-gpus';
    this.addClass('jp-gpulab-panel');
    this.title.icon = gpuIcon;
    this.title.caption = "This server's GPUs, as the hub measures them";
    this.node.append(el('h2', 'jp-gpulab-panel-title', 'GPUs'), this.body);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.actions.refresh(); // fresh numbers as soon as the panel opens
  }

  /** Render the hub's answer; `mode` is the server's mode label ("A100-80G x1 (simulated)"). */
  render(usage: IGpuUsage | null, mode: string, error = ''): void {
    this.body.replaceChildren();
    if (error) {
      this.body.appendChild(el('p', 'jp-gpulab-note', `GPU figures unavailable: ${error}`));
      return;
    }
    if (!usage) {
      this.body.appendChild(el('p', 'jp-gpulab-note', 'Loading…'));
      return;
    }
    if (!usage.cards.length) {
      this.body.dataset.state = 'none';
      this.body.appendChild(
        el('p', 'jp-gpulab-state', 'No GPU in this mode. Switch to a GPU to train on one.')
      );
      return;
    }
    const simulated = usage.cards.every(c => c.simulated);
    this.body.dataset.state = simulated ? 'simulated' : 'measured';
    if (usage.nudge) {
      this.body.appendChild(this.nudgeBox(usage));
    } else if (usage.idle_seconds !== null && usage.idle_seconds >= 60) {
      this.body.appendChild(
        el('p', 'jp-gpulab-note jp-gpulab-idle', `Idle for ${idleText(usage.idle_seconds)}.`)
      );
    }
    if (simulated) {
      this.body.appendChild(
        el(
          'p',
          'jp-gpulab-state',
          `${mode}: these GPUs are simulated (this machine has none). Utilisation follows your ` +
            "server's CPU use as the hub measures it; there is no memory or process to show."
        )
      );
    }
    for (const card of usage.cards) {
      this.body.appendChild(this.card(card));
    }
    this.body.appendChild(
      el('p', 'jp-gpulab-note', 'Measured by the hub every few seconds, not by this server.')
    );
  }

  private nudgeBox(usage: IGpuUsage): HTMLElement {
    const box = el('div', 'jp-gpulab-nudge');
    box.setAttribute('role', 'status');
    box.appendChild(el('p', 'jp-gpulab-nudge-text', usage.nudge!.text));
    if (!this.dismissed) {
      const actions = el('div', 'jp-gpulab-nudge-actions');
      const go = el('button', 'jp-mod-styled jp-mod-accept jp-gpulab-nudge-switch');
      go.type = 'button';
      go.textContent = 'Switch to no-GPU…';
      go.addEventListener('click', () => this.actions.switchToNoGpu());
      const later = el('button', 'jp-mod-styled jp-gpulab-nudge-dismiss');
      later.type = 'button';
      later.textContent = 'Dismiss';
      later.addEventListener('click', () => this.actions.dismiss());
      actions.append(go, later);
      box.appendChild(actions);
    }
    return box;
  }

  private card(c: IGpuCard): HTMLElement {
    const node = el('div', 'jp-gpulab-gpu');
    node.dataset.uuid = c.uuid;
    const name = `${cardName(c, this.actions.typeName)}${c.simulated ? ' (simulated)' : ''}`;
    node.appendChild(el('div', 'jp-gpulab-gpu-name', name));
    node.appendChild(el('div', 'jp-gpulab-gpu-id', c.uuid));
    if (!isRead(c)) {
      node.appendChild(el('div', 'jp-gpulab-note', 'Not measured yet…'));
      return node;
    }
    if (c.util_pct === null) {
      // Read, but NVML gives no utilisation for this card: not a made-up 0%.
      const note = 'Utilisation: n/a (NVML gives none for this card)';
      node.appendChild(el('div', 'jp-gpulab-note', note));
    } else {
      node.appendChild(bar('Utilisation', c.util_pct, `${Math.round(c.util_pct)}%`));
    }
    if (!c.simulated && c.mem_used_mib !== null && c.mem_total_mib) {
      node.appendChild(
        bar(
          'Memory',
          (100 * c.mem_used_mib) / c.mem_total_mib,
          memoryPair(c.mem_used_mib, c.mem_total_mib)
        )
      );
    }
    const sensors = [
      c.power_w !== null ? `${Math.round(c.power_w)} W` : '',
      c.temp_c !== null ? `${Math.round(c.temp_c)} °C` : ''
    ].filter(Boolean);
    if (sensors.length) {
      node.appendChild(
        el('div', 'jp-gpulab-note', `${sensors.join(' · ')}${c.simulated ? ' (derived)' : ''}`)
      );
    }
    if (c.simulated) {
      node.appendChild(el('div', 'jp-gpulab-note', 'Simulated card: no per-process figures.'));
    } else if (!c.processes.length) {
      node.appendChild(el('div', 'jp-gpulab-note', 'No process on this card.'));
    } else {
      const list = el('ul', 'jp-gpulab-procs');
      for (const p of c.processes) {
        const used = p.used_mib === null ? 'memory not given' : `${gibText(p.used_mib)} GiB`;
        list.appendChild(el('li', '', `PID ${p.pid}: ${used}`));
      }
      node.appendChild(list);
    }
    return node;
  }
}
