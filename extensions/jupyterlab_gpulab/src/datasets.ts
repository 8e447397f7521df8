// The datasets plugin: the Datasets panel in the left sidebar (the catalog, what is mounted),
// and its commands: mount / unmount a dataset (a restart, through the switch flow) and open a
// mounted one in the file browser.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';

import { datasetsAfter, IStatus, priceChange } from './logic';
import { runSwitch } from './switcher';
import { CommandIDs, IGpulabSession } from './tokens';
import { DatasetsPanel } from './widgets';

async function mountDataset(
  app: JupyterFrontEnd,
  session: IGpulabSession,
  slug: string,
  mount: boolean
): Promise<void> {
  const status = session.status;
  const name = session.catalog?.datasets[slug]?.display_name || slug;
  await runSwitch(app, status, {
    request: { datasets: datasetsAfter(status.datasets, slug, mount) },
    title: mount ? `Mount ${name}?` : `Unmount ${name}?`,
    target: `${status.mode} ${mount ? 'with' : 'without'} ${name}`,
    priceLine: priceChange(status.price_per_hour, status.price_per_hour, status.currency)
  });
}

async function openDataset(
  app: JupyterFrontEnd,
  fileBrowser: IDefaultFileBrowser | null,
  slug: string
): Promise<void> {
  const path = `datasets/${slug}`;
  await app.restored;
  await fileBrowser?.model.restored;
  await app.commands.execute('filebrowser:go-to-path', { path });
  if (!fileBrowser) {
    return;
  }
  // Right after a reload the file browser may still be restoring its saved folder, which moves
  // it away again; keep the requested folder for the next two seconds.
  const model = fileBrowser.model;
  for (let i = 0; i < 20; i++) {
    await new Promise(r => setTimeout(r, 100));
    if (model.path !== path) {
      await model.cd(`/${path}`);
    }
  }
}

export const datasetsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:datasets',
  description: 'gpulab: the Datasets panel, mount / unmount and open a dataset',
  autoStart: true,
  requires: [IGpulabSession],
  optional: [IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    session: IGpulabSession | null,
    fileBrowser: IDefaultFileBrowser | null
  ): void => {
    if (!session) {
      return;
    }
    app.commands.addCommand(CommandIDs.mount, {
      label: args => `${args.mount ? 'Mount' : 'Unmount'} dataset ${args.slug}`,
      execute: args => mountDataset(app, session, String(args.slug), !!args.mount)
    });
    app.commands.addCommand(CommandIDs.openDataset, {
      label: args => `Open dataset ${args.slug} in the file browser`,
      execute: args => openDataset(app, fileBrowser, String(args.slug))
    });

    const panel = new DatasetsPanel({
      mount: (slug, mount) => void app.commands.execute(CommandIDs.mount, { slug, mount }),
      open: slug => void app.commands.execute(CommandIDs.openDataset, { slug })
    });
    app.shell.add(panel, 'left', { rank: 700 });
    const render = () => panel.render(session.catalog, session.status, session.catalogError);
    panel.render(null, session.status); // "Loading the catalog…"
    void session.catalogLoaded.then(render);
    // The mounted datasets change only with a restart (and a reload), but should the status
    // say otherwise, show it.
    let mounted = session.status.datasets.join('\n');
    session.statusChanged.connect((_, status: IStatus) => {
      const now = status.datasets.join('\n');
      if (now !== mounted) {
        mounted = now;
        render();
      }
    });
  }
};
