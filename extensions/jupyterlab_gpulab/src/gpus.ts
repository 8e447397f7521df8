// The GPU panel plugin: this server's GPUs in the left sidebar, live from NVML (read every 2 s
// while the panel is shown), or why there are none.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';

import { getGpus } from './api';
import { IGpulabSession } from './tokens';
import { GpuPanel } from './widgets';

const GPU_REFRESH_MS = 2000;

export const gpuPanelPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:gpus',
  description: "gpulab: the GPU panel (this server's GPUs, utilization and memory)",
  autoStart: true,
  requires: [IGpulabSession],
  activate: (app: JupyterFrontEnd, session: IGpulabSession | null): void => {
    if (!session) {
      return;
    }
    const panel = new GpuPanel(() => void refresh());
    app.shell.add(panel, 'left', { rank: 710 });
    async function refresh(): Promise<void> {
      try {
        panel.render(await getGpus());
      } catch (e) {
        panel.render(null, (e as Error).message);
      }
    }
    void refresh();
    setInterval(() => {
      if (panel.isVisible) {
        void refresh();
      }
    }, GPU_REFRESH_MS);
  }
};
