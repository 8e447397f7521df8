// The visible parts: the status-bar item, the Datasets panel and the body of the "Switch to
// GPU..." dialog (the GPU panel is gpupanel.ts).
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IBalance, ICatalog, IGpuChoice, IStatus, isNoGpu, statusParts } from './logic';
import { formatCountdown, ISpotStatus, spotPriceText, spotTitle } from './spot';

/** A `tag` element of class `className`, its text (if any) put in as textContent. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text) {
    node.textContent = text;
  }
  return node;
}

export const datasetsIcon = new LabIcon({
  name: 'gpulab:datasets',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<ellipse cx="12" cy="5" rx="8" ry="3"/><path d="M4 7v4c0 1.7 3.6 3 8 3s8-1.3 8-3V7c0 1.7-3.6 3-8 3S4 8.7 4 7z"/>' +
    '<path d="M4 13v5c0 1.7 3.6 3 8 3s8-1.3 8-3v-5c0 1.7-3.6 3-8 3s-8-1.3-8-3z"/></g></svg>'
});

export const gpuIcon = new LabIcon({
  name: 'gpulab:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M2 6h18v12H2zM4 8v8h14V8z"/><rect x="6" y="10" width="4" height="4"/><rect x="12" y="10" width="4" height="4"/>' +
    '<path d="M20 9h2v2h-2zM20 13h2v2h-2zM5 18h2v3H5zM10 18h2v3h-2zM15 18h2v3h-2z"/></g></svg>'
});

/**
 * Status bar: mode · price (the spot price and bid on spot servers) · session cost · balance,
 * the preemption countdown while a warning is on, and the no-GPU toggle button.
 */
export class StatusItem extends Widget {
  private modeNode = el('span', 'jp-gpulab-mode');
  private priceNode = el('span', 'jp-gpulab-price');
  private costNode = el('span', 'jp-gpulab-cost');
  private balanceNode = el('span', 'jp-gpulab-balance');
  private countdownNode = el('span', 'jp-gpulab-countdown');
  private toggle = el('button', 'jp-gpulab-toggle');
  status: IStatus | null = null;
  balance: IBalance | null = null;
  spot: ISpotStatus | null = null;
  /** Seconds before a preemption stops this server; null: no warning. */
  secondsLeft: number | null = null;
  countdownTitle = '';

  constructor(onToggle: () => void) {
    super();
    this.addClass('jp-gpulab-status');
    this.countdownNode.setAttribute('role', 'timer');
    this.countdownNode.hidden = true;
    this.node.append(
      this.modeNode,
      this.priceNode,
      this.costNode,
      this.balanceNode,
      this.countdownNode,
      this.toggle
    );
    this.toggle.type = 'button';
    this.toggle.addEventListener('click', () => onToggle());
    this.modeNode.textContent = 'gpulab …';
  }

  render(nowMs: number = Date.now()): void {
    if (!this.status) {
      return;
    }
    const spot = this.status.pricing === 'spot';
    // A spot server's price is the hub's, from its spot status; never the on-demand price.
    const spotPrice = this.spot && this.spot.available ? this.spot.price_per_hour : null;
    const parts = statusParts(this.status, this.balance, nowMs, spotPrice);
    this.modeNode.textContent = parts.mode;
    this.priceNode.textContent = spot
      ? spotPriceText(this.spot, this.status.gpu_count, this.status.currency)
      : parts.price;
    this.priceNode.classList.toggle('jp-gpulab-spot', spot);
    this.priceNode.classList.toggle(
      'jp-gpulab-unavailable',
      spot && !!this.spot && !this.spot.available
    );
    this.countdownNode.hidden = this.secondsLeft === null;
    this.countdownNode.textContent =
      this.secondsLeft === null
        ? ''
        : this.secondsLeft > 0
          ? `reclaimed in ${formatCountdown(this.secondsLeft)}`
          : 'reclaimed: stopping';
    this.countdownNode.title = this.countdownTitle;
    this.costNode.textContent = parts.cost;
    this.balanceNode.textContent = parts.balance;
    this.balanceNode.classList.toggle(
      'jp-gpulab-unavailable',
      !!this.balance && !this.balance.available
    );
    this.node.title = spot
      ? `${parts.title}\n${spotTitle(this.spot, this.status.currency)}`
      : parts.title;
    this.toggle.textContent = isNoGpu(this.status) ? 'Switch to GPU…' : 'Switch to no-GPU';
    this.toggle.disabled = !this.status.gpulab;
  }
}

/** Left sidebar: the dataset catalog with mount / unmount / open. */
export class DatasetsPanel extends Widget {
  constructor(
    private actions: {
      mount: (slug: string, mount: boolean) => void;
      open: (slug: string) => void;
    }
  ) {
    super();
    this.id = 'gpulab-datasets';
    this.addClass('jp-gpulab-panel');
    this.title.icon = datasetsIcon;
    this.title.caption = 'Datasets';
    this.node.appendChild(el('h2', 'jp-gpulab-panel-title', 'Datasets'));
    this.list = el('div', 'jp-gpulab-datasets');
    this.node.appendChild(this.list);
  }

  private list: HTMLDivElement;

  render(catalog: ICatalog | null, status: IStatus | null, error = ''): void {
    this.list.replaceChildren();
    if (error || !catalog || !status) {
      this.list.appendChild(el('p', 'jp-gpulab-note', error || 'Loading the catalog…'));
      return;
    }
    const entries = Object.entries(catalog.datasets);
    if (entries.length === 0) {
      this.list.appendChild(el('p', 'jp-gpulab-note', 'This platform offers no datasets.'));
    }
    for (const [slug, ds] of entries) {
      const mounted = status.datasets.includes(slug);
      const card = el('div', 'jp-gpulab-dataset');
      card.dataset.slug = slug;
      const head = el('div', 'jp-gpulab-dataset-head');
      head.append(
        el('span', 'jp-gpulab-dataset-name', ds.display_name),
        el('span', 'jp-gpulab-dataset-size', ds.size),
        el(
          'span',
          mounted ? 'jp-gpulab-badge jp-gpulab-mounted' : 'jp-gpulab-badge',
          mounted ? 'mounted' : 'not mounted'
        )
      );
      card.append(
        head,
        el('div', 'jp-gpulab-dataset-desc', ds.description),
        el('div', 'jp-gpulab-dataset-license', `License: ${ds.license}`)
      );
      const buttons = el('div', 'jp-gpulab-dataset-actions');
      const toggle = el('button', 'jp-mod-styled jp-gpulab-mount', mounted ? 'Unmount' : 'Mount');
      toggle.addEventListener('click', () => this.actions.mount(slug, !mounted));
      buttons.appendChild(toggle);
      if (mounted) {
        const open = el('button', 'jp-mod-styled jp-mod-accept jp-gpulab-open', 'Open');
        open.title = `Show ~/datasets/${slug} in the file browser`;
        open.addEventListener('click', () => this.actions.open(slug));
        buttons.appendChild(open);
      }
      card.appendChild(buttons);
      this.list.appendChild(card);
    }
    this.list.appendChild(
      el(
        'p',
        'jp-gpulab-note',
        'Datasets are mounted read-only at ~/datasets/NAME. Mounting or unmounting restarts ' +
          'this server (files are kept, kernels stop).'
      )
    );
  }
}

/** The body of the "Switch to GPU..." dialog: GPU type (with free cards and price) and count. */
export class GpuChooser extends Widget {
  private type = document.createElement('select');
  private count = document.createElement('select');

  constructor(
    private choices: IGpuChoice[],
    private maxGpus: number
  ) {
    super();
    this.addClass('jp-gpulab-chooser');
    const typeLabel = document.createElement('label');
    typeLabel.textContent = 'GPU type';
    for (const c of choices) {
      const option = document.createElement('option');
      option.value = c.slug;
      option.textContent = c.label;
      option.disabled = c.disabled;
      this.type.appendChild(option);
    }
    const first = choices.find(c => !c.disabled);
    if (first) {
      this.type.value = first.slug;
    }
    this.type.className = 'jp-gpulab-choose-type';
    const countLabel = document.createElement('label');
    countLabel.textContent = 'Cards';
    this.count.className = 'jp-gpulab-choose-count';
    this.type.addEventListener('change', () => this.fillCounts());
    typeLabel.appendChild(this.type);
    countLabel.appendChild(this.count);
    this.node.append(typeLabel, countLabel);
    this.fillCounts();
  }

  private fillCounts(): void {
    const choice = this.choices.find(c => c.slug === this.type.value);
    this.count.replaceChildren();
    const n = Math.max(1, Math.min(choice ? choice.free : 1, this.maxGpus));
    for (let i = 1; i <= n; i++) {
      const option = document.createElement('option');
      option.value = String(i);
      option.textContent = String(i);
      this.count.appendChild(option);
    }
  }

  getValue(): { choice: IGpuChoice; gpus: number } | null {
    const choice = this.choices.find(c => c.slug === this.type.value);
    return choice ? { choice, gpus: Number(this.count.value || 1) } : null;
  }
}
