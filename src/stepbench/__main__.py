from stepbench.cli import main

raise SystemExit(main())
