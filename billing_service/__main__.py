from gpulab.billing_service.app import main

main()
